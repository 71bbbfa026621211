// GPU misuse on recorded nvidia-smi outputs: the ranks' processes against the compute
// processes nvidia-smi lists.

#include "agent/gpu_misuse.hpp"

#include <gtest/gtest.h>

#include "tests/unit/agent/test_data.hpp"

namespace corral::agent {
namespace {

using test_data::read_data;

std::vector<model::Gpu> dgx_a100_gpus() {
  auto rows = parse_query_gpu(read_data("dgx-a100/query_gpu.csv"));
  EXPECT_TRUE(rows.has_value());
  std::vector<model::Gpu> gpus;
  for (const auto& r : rows.value_or(std::vector<GpuRow>{})) {
    model::Gpu g;
    g.index = r.index;
    g.uuid = r.uuid;
    gpus.push_back(g);
  }
  return gpus;
}

// Four ranks of a DDP job, pids 731204..731207 as in the recordings, rank r on GPU r,
// each behind a shell wrapper.
std::vector<RankOnGpus> four_ranks() {
  std::vector<RankOnGpus> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back({r, {{731100 + r, "sh"}, {731204 + r, "python3"}}, {r}});
  return ranks;
}

TEST(GpuMisuse, EachRankOnItsOwnGpuIsFine) {
  auto apps = parse_compute_apps(read_data("dgx-a100/compute_apps.csv"));
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  EXPECT_TRUE(find_gpu_misuse(four_ranks(), *apps, dgx_a100_gpus()).empty());
}

TEST(GpuMisuse, EveryRankOnGpuZeroNamesTheMissingSetDevice) {
  auto apps = parse_compute_apps(read_data("dgx-a100/compute_apps_no_set_device.csv"));
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  auto found = find_gpu_misuse(four_ranks(), *apps, dgx_a100_gpus());
  ASSERT_EQ(found.size(), 3u);
  EXPECT_FALSE(found.contains(0)) << "GPU 0 is rank 0's own";
  EXPECT_EQ(found.at(2).gpu, 0);
  EXPECT_EQ(found.at(2).text,
            "pid 731206 (python3) holds memory on GPU 0 (GPU-8b8c764d-1c0a-cb3d-ea13-519a60a077bb), which is not "
            "its own (its GPU: 2); ranks 0, 1, 2 and 3 all use GPU 0: does the program call "
            "torch.cuda.set_device(LOCAL_RANK)?");
}

TEST(GpuMisuse, OneRankOnAnotherJobsGpuAndProcessesThatAreNoRanksOrUnnamed) {
  std::vector<ComputeApp> apps = {
      {731205, "GPU-dcb6de07-03b4-ab7e-d013-e50181d960e9", 700},  // rank 1 on GPU 3, no rank's
      {999999, "GPU-8b8c764d-1c0a-cb3d-ea13-519a60a077bb", 100},  // not a rank's process
      {std::nullopt, "GPU-d142880e-8427-abee-c129-75fd55911ea2", std::nullopt},  // not named
      {731206, "GPU-not-on-this-node", 5},
  };
  auto ranks = four_ranks();
  ranks.resize(3);
  ranks[1].gpus = {1, 2};
  auto found = find_gpu_misuse(ranks, apps, dgx_a100_gpus());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found.at(1).gpu, 3);
  EXPECT_EQ(found.at(1).text,
            "pid 731205 (python3) holds memory on GPU 3 (GPU-dcb6de07-03b4-ab7e-d013-e50181d960e9), which is not "
            "its own (its GPUs: 1 and 2)");
}

// Once a job's ranks are dead: what still holds its GPUs, on the recording of four ranks
// on GPUs 0-3 (pids 731204..731207), with a process nvidia-smi will not name on GPU 3.
TEST(GpusStillHeld, NamesEachProcessOnTheJobsGpusAndNothingElse) {
  auto apps = parse_compute_apps(read_data("dgx-a100/compute_apps.csv") +
                                 "[Insufficient Permissions], GPU-dcb6de07-03b4-ab7e-d013-e50181d960e9, [N/A]\n");
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  EXPECT_TRUE(gpus_still_held(*apps, {"GPU-00000000-0000-0000-0000-000000000000"}).empty())
      << "a GPU no process uses is free";
  EXPECT_TRUE(gpus_still_held(*apps, {}).empty());
  EXPECT_EQ(gpus_still_held(*apps, {"GPU-d142880e-8427-abee-c129-75fd55911ea2"}),
            std::vector<std::string>{"GPU-d142880e-8427-abee-c129-75fd55911ea2 by pid 731205"});
  EXPECT_EQ(gpus_still_held(*apps, {"GPU-dcb6de07-03b4-ab7e-d013-e50181d960e9", "GPU-8b8c764d-1c0a-cb3d-ea13-519a60a077bb"}),
            (std::vector<std::string>{"GPU-8b8c764d-1c0a-cb3d-ea13-519a60a077bb by pid 731204",
                                      "GPU-dcb6de07-03b4-ab7e-d013-e50181d960e9 by pid 731207",
                                      "GPU-dcb6de07-03b4-ab7e-d013-e50181d960e9 by a process nvidia-smi will not name"}));
}

}  // namespace
}  // namespace corral::agent
