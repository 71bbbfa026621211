// The simulated inventory format, and every file in configs/sim/.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/model/sim_inventory_yaml.hpp"

namespace corral::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

Result<SimInventory> parse(std::string_view yaml) {
  return parse_sim_inventory(yaml, "sim.yaml");
}

std::string problems_of(std::string_view yaml) {
  auto sim = parse(yaml);
  EXPECT_FALSE(sim.has_value()) << "parsed, but should not have:\n" << yaml;
  if (sim) return "";
  EXPECT_EQ(sim.error().code(), ErrorCode::InvalidArgument);
  return sim.error().message();
}

TEST(SimInventory, ReadsTheOneLineFormat) {
  auto sim = parse(
      R"({driver: "550.54.15", cuda: "12.4", gpus: [{name: "NVIDIA A100-SXM4-80GB", memory_mb: 81920, count: 8, nvlink: true}]})");
  ASSERT_TRUE(sim.has_value()) << sim.error().message();
  EXPECT_EQ(sim->driver, "550.54.15");
  EXPECT_EQ(sim->cuda, (CudaVersion{12, 4}));
  ASSERT_EQ(sim->gpus.size(), 8u);
  for (const auto& gpu : sim->gpus) {
    EXPECT_EQ(gpu.cls, (GpuClass{"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"}));
    EXPECT_EQ(gpu.cuda, (CudaVersion{12, 4}));
  }
}

TEST(SimInventory, GivesGroupsConsecutiveIndicesAndDeterministicUuids) {
  const std::string yaml = R"(
driver: "550.54.15"
cuda: "12.4"
gpus:
  - {name: "NVIDIA A100 80GB PCIe", memory_mb: 81920, count: 2}
  - {name: "Tesla V100-PCIE-32GB", memory_mb: 32768, count: 3}
)";
  auto first = parse(yaml);
  auto second = parse(yaml);
  ASSERT_TRUE(first.has_value()) << first.error().message();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*first, *second);
  ASSERT_EQ(first->gpus.size(), 5u);
  std::set<std::string> uuids;
  std::set<std::string> buses;
  for (int i = 0; i < 5; ++i) {
    const Gpu& gpu = first->gpus[static_cast<std::size_t>(i)];
    EXPECT_EQ(gpu.index, i);
    uuids.insert(gpu.uuid);
    buses.insert(gpu.pci_bus_id);
  }
  EXPECT_EQ(uuids.size(), 5u);
  EXPECT_EQ(buses.size(), 5u);
  EXPECT_EQ(first->gpus[0].uuid, "GPU-sim-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(first->gpus[4].uuid, "GPU-sim-00000000-0000-0000-0001-000000000004");
  EXPECT_EQ(first->gpus[2].cls.product, "Tesla V100-PCIE-32GB");
}

TEST(SimInventory, JoinsAGroupAllToAllOnlyWhenNvlinkIsTrue) {
  auto sim = parse(R"(
driver: "550.54.15"
cuda: "12.4"
gpus:
  - {name: "NVIDIA H100 80GB HBM3", memory_mb: 81920, count: 4, nvlink: true}
  - {name: "NVIDIA L4", memory_mb: 23034, count: 2, nvlink: false}
  - {name: "NVIDIA A100 80GB PCIe", memory_mb: 81920, count: 2, nvlink: true}
)");
  ASSERT_TRUE(sim.has_value()) << sim.error().message();
  EXPECT_THAT(sim->gpus[0].nvlink_peers, ElementsAre(1, 2, 3));
  EXPECT_THAT(sim->gpus[3].nvlink_peers, ElementsAre(0, 1, 2));
  EXPECT_TRUE(sim->gpus[4].nvlink_peers.empty());
  EXPECT_TRUE(sim->gpus[5].nvlink_peers.empty());
  // Groups are never joined to each other.
  EXPECT_THAT(sim->gpus[6].nvlink_peers, ElementsAre(7));
  EXPECT_THAT(sim->gpus[7].nvlink_peers, ElementsAre(6));
}

TEST(SimInventory, CountDefaultsToOneAndNvlinkToFalse) {
  auto sim =
      parse("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus:\n  - {name: \"NVIDIA L4\", memory_mb: 23034}\n");
  ASSERT_TRUE(sim.has_value()) << sim.error().message();
  ASSERT_EQ(sim->gpus.size(), 1u);
  EXPECT_TRUE(sim->gpus[0].nvlink_peers.empty());
}

TEST(SimInventory, AcceptsAnUnquotedCudaVersion) {
  auto sim = parse("driver: 580.65.06\ncuda: 13.0\ngpus: [{name: NVIDIA B200, memory_mb: 183359}]\n");
  ASSERT_TRUE(sim.has_value()) << sim.error().message();
  EXPECT_EQ(sim->cuda, (CudaVersion{13, 0}));
  EXPECT_EQ(sim->driver, "580.65.06");
}

TEST(SimInventory, RejectsAnUnknownFieldWithASuggestionAndItsPosition) {
  const std::string message = problems_of(R"(driver: "550.54.15"
cuda: "12.4"
gpus:
  - name: "NVIDIA A100-SXM4-80GB"
    memory_gb: 80
)");
  EXPECT_THAT(message, HasSubstr("sim.yaml:5:5: gpus[0].memory_gb: unknown field"));
  EXPECT_THAT(message, HasSubstr("did you mean \"memory_mb\"?"));
  EXPECT_THAT(message, HasSubstr("gpus[0].memory_mb: required field is missing"));
}

TEST(SimInventory, RejectsAnUnknownTopLevelField) {
  EXPECT_THAT(
      problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\nnode: gpu01\ngpus: [{name: X, memory_mb: 1}]\n"),
      HasSubstr("sim.yaml:3:1: node: unknown field"));
}

TEST(SimInventory, NamesTheRecordedComputeProcessesAndUtilizationFiles) {
  auto sim = parse(
      "driver: \"550.54.15\"\ncuda: \"12.4\"\ncompute_apps: apps.csv\nutilization: busy.csv\n"
      "gpus: [{name: X, memory_mb: 1}]\n");
  ASSERT_TRUE(sim.has_value()) << sim.error().message();
  EXPECT_EQ(sim->compute_apps, "apps.csv");
  EXPECT_EQ(sim->utilization, "busy.csv");
  EXPECT_THAT(
      problems_of(
          "driver: \"550.54.15\"\ncuda: \"12.4\"\nutilization: \"\"\ngpus: [{name: X, memory_mb: 1}]\n"),
      HasSubstr("utilization: must be a file name"));
  EXPECT_THAT(
      problems_of(
          "driver: \"550.54.15\"\ncuda: \"12.4\"\nutilization: [a]\ngpus: [{name: X, memory_mb: 1}]\n"),
      HasSubstr("sim.yaml:3:14: utilization"));
}

TEST(SimInventory, RejectsACountOutsideOneTo64) {
  EXPECT_THAT(
      problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: [{name: X, memory_mb: 1, count: 0}]\n"),
      HasSubstr("sim.yaml:3:39: gpus[0].count: must be an integer from 1 to 64, got \"0\""));
  EXPECT_THAT(
      problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: [{name: X, memory_mb: 1, count: 65}]\n"),
      HasSubstr("gpus[0].count"));
  EXPECT_THAT(
      problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: [{name: X, memory_mb: 1, count: two}]\n"),
      HasSubstr("got \"two\""));
}

TEST(SimInventory, RejectsMoreThan64GpusInAll) {
  EXPECT_THAT(problems_of(R"(driver: "550.54.15"
cuda: "12.4"
gpus:
  - {name: A, memory_mb: 1, count: 40}
  - {name: B, memory_mb: 1, count: 40}
)"),
              HasSubstr("80 GPUs in all; a node has at most 64"));
}

TEST(SimInventory, RejectsMissingRequiredFields) {
  const std::string message = problems_of("gpus: [{name: X, memory_mb: 1}]\n");
  EXPECT_THAT(message, HasSubstr("driver: required field is missing"));
  EXPECT_THAT(message, HasSubstr("cuda: required field is missing"));
}

TEST(SimInventory, RejectsBadDriverAndCudaVersions) {
  const std::string message =
      problems_of("driver: latest\ncuda: \"12.x\"\ngpus: [{name: X, memory_mb: 1}]\n");
  EXPECT_THAT(message, HasSubstr("sim.yaml:1:9: driver: must be a driver version like"));
  EXPECT_THAT(message, HasSubstr("sim.yaml:2:7: cuda: must be MAJOR.MINOR"));
}

TEST(SimInventory, RejectsAnEmptyGpuListAndANonBooleanNvlink) {
  EXPECT_THAT(problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: []\n"),
              HasSubstr("gpus: must be a non-empty list"));
  EXPECT_THAT(
      problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: [{name: X, memory_mb: 1, nvlink: maybe}]\n"),
      HasSubstr("gpus[0].nvlink: must be true or false, got \"maybe\""));
}

TEST(SimInventory, RejectsAFieldSetTwice) {
  EXPECT_THAT(
      problems_of(
          "driver: \"550.54.15\"\ndriver: \"535.104.05\"\ncuda: \"12.4\"\ngpus: [{name: X, memory_mb: 1}]\n"),
      HasSubstr("sim.yaml:2:1: driver: set twice"));
}

TEST(SimInventory, ReportsEveryProblemNotJustTheFirst) {
  const std::string message = problems_of(R"(driver: "550.54.15"
cuda: "12.4"
gpus:
  - {name: "", memory_mb: 0}
  - {name: X, memory_mb: 1, count: 100}
)");
  EXPECT_THAT(message, HasSubstr("gpus[0].name"));
  EXPECT_THAT(message, HasSubstr("gpus[0].memory_mb"));
  EXPECT_THAT(message, HasSubstr("gpus[1].count"));
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 2);
}

TEST(SimInventory, ReportsYamlSyntaxErrorsWithLineAndColumn) {
  EXPECT_THAT(problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: [{name: X, memory_mb: 1}\n"),
              ::testing::MatchesRegex("sim\\.yaml:[0-9]+:[0-9]+: .*"));
}

TEST(SimInventory, RejectsEmptyAndNonMapDocuments) {
  EXPECT_THAT(problems_of(""), HasSubstr("sim.yaml: file is empty"));
  EXPECT_THAT(problems_of("- a\n- b\n"), HasSubstr("must be a map"));
  EXPECT_THAT(problems_of("driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus: [8]\n"),
              HasSubstr("gpus[0]: must be a map"));
}

TEST(SimInventory, RejectsAnOversizedFile) {
  EXPECT_THAT(problems_of(std::string(kMaxSimInventoryBytes + 1, '#')), HasSubstr("the limit is 65536"));
}

TEST(SimInventory, RejectsDeeplyNestedInputWithoutCrashing) {
  EXPECT_FALSE(parse(std::string(60000, '[')).has_value());
  EXPECT_FALSE(parse("gpus: " + std::string(20000, '[') + std::string(20000, ']')).has_value());
}

// ------------------------------------------------------------------ configs/sim

std::vector<fs::path> sim_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fs::path(CORRAL_SOURCE_DIR) / "configs" / "sim")) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

Result<SimInventory> load(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_sim_inventory(text.str(), path.filename().string());
}

TEST(SimConfigs, ThereAreAtLeastFive) {
  EXPECT_GE(sim_files().size(), 5u);
}

TEST(SimConfigs, EveryFileLoads) {
  for (const auto& path : sim_files()) {
    auto sim = load(path);
    EXPECT_TRUE(sim.has_value()) << path << ": " << (sim ? "" : sim.error().message());
    if (sim) {
      EXPECT_FALSE(sim->gpus.empty()) << path;
    }
  }
}

TEST(SimConfigs, EachFileHoldsWhatItsNamePromises) {
  const fs::path dir = fs::path(CORRAL_SOURCE_DIR) / "configs" / "sim";
  auto a100 = load(dir / "a100x8.yaml");
  auto h100 = load(dir / "h100x8.yaml");
  auto a100_40 = load(dir / "a100-40gb-x4.yaml");
  auto old = load(dir / "a100x8-old-driver.yaml");
  auto rtx = load(dir / "rtx4090x2.yaml");
  ASSERT_TRUE(a100 && h100 && a100_40 && old && rtx);

  EXPECT_EQ(a100->gpus.size(), 8u);
  EXPECT_EQ(a100->gpus[0].cls, (GpuClass{"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"}));
  EXPECT_EQ(a100->gpus[0].nvlink_peers.size(), 7u);
  EXPECT_EQ(h100->gpus[0].cls, (GpuClass{"NVIDIA H100 80GB HBM3", 81920, "550.54.15"}));
  EXPECT_EQ(h100->gpus.size(), 8u);
  EXPECT_EQ(a100_40->gpus.size(), 4u);
  EXPECT_EQ(a100_40->gpus[0].cls.memory_mib, 40960);
  EXPECT_TRUE(a100_40->gpus[0].nvlink_peers.empty());
  EXPECT_EQ(old->cuda, (CudaVersion{12, 2}));
  EXPECT_EQ(old->gpus[0].cls.driver, "535.104.05");
  EXPECT_NE(old->gpus[0].cls, a100->gpus[0].cls);  // the driver splits the class
  EXPECT_EQ(rtx->gpus.size(), 2u);
  EXPECT_EQ(rtx->gpus[1].cls, (GpuClass{"NVIDIA GeForce RTX 4090", 24564, "550.54.15"}));
}

}  // namespace
}  // namespace corral::model
