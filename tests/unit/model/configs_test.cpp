// Every example job in configs/examples/ is one a person copies: it must parse cleanly.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/model/job_spec_yaml.hpp"

namespace corral::model {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> example_jobs() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fs::path(CORRAL_SOURCE_DIR) / "configs" / "examples")) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ExampleJobs, ThereAreAtLeastFive) {
  EXPECT_GE(example_jobs().size(), 5u);
}

TEST(ExampleJobs, EveryOneParsesWithoutProblems) {
  for (const auto& path : example_jobs()) {
    auto spec = parse_job_spec(read_file(path), path.filename().string());
    EXPECT_TRUE(spec.has_value()) << (spec ? "" : spec.error().message());
  }
}

TEST(ExampleJobs, AskForTheShapesTheirNamesPromise) {
  const fs::path dir = fs::path(CORRAL_SOURCE_DIR) / "configs" / "examples";
  auto load = [&](const char* file) {
    auto spec = parse_job_spec(read_file(dir / file), file);
    EXPECT_TRUE(spec.has_value()) << file;
    return spec.value_or(JobSpec{});
  };
  EXPECT_EQ(total_gpus(load("single-gpu.yaml")), 1);
  EXPECT_EQ(candidate_shapes(load("ddp-one-node.yaml")), (std::vector<std::pair<int, int>>{{1, 4}}));
  EXPECT_EQ(candidate_shapes(load("ddp-two-node.yaml")), (std::vector<std::pair<int, int>>{{2, 2}}));
  EXPECT_EQ(load("nccl-native.yaml").mode, LaunchMode::Nccl);
  JobSpec tcp = load("tcp-check-two-node.yaml");
  EXPECT_EQ(candidate_shapes(tcp), (std::vector<std::pair<int, int>>{{2, 2}}));
  EXPECT_EQ(tcp.command, (Command{false, {"corral-worker", "tcp-check"}}));
}

}  // namespace
}  // namespace corral::model
