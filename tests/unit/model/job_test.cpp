#include "common/model/job.hpp"

#include <gtest/gtest.h>

namespace corral::model {
namespace {

TEST(JobState, NamesRoundTrip) {
  for (JobState s : kAllJobStates) {
    EXPECT_EQ(parse_job_state(to_string(s)), s);
  }
  EXPECT_EQ(to_string(JobState::NodeFail), "NODE_FAIL");
  EXPECT_FALSE(parse_job_state("running").has_value());
}

TEST(CandidateShapes, TotalGpusSpreadOverFewestNodesFirst) {
  JobSpec spec;
  spec.total_gpus = 8;
  auto shapes = candidate_shapes(spec);
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[0], std::make_pair(1, 8));
  EXPECT_EQ(shapes[1], std::make_pair(2, 4));
  EXPECT_EQ(shapes[3], std::make_pair(8, 1));
}

TEST(CandidateShapes, ProcsPerNodeMustDivideEachNodesShare) {
  JobSpec spec;
  spec.total_gpus = 8;
  spec.procs_per_node = 4;
  auto shapes = candidate_shapes(spec);
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes[0], std::make_pair(1, 8));
  EXPECT_EQ(shapes[1], std::make_pair(2, 4));
}

TEST(AssignRanks, OneProcessPerGpuNodeByNode) {
  JobSpec spec;
  spec.nodes = 2;
  spec.gpus_per_node = 2;
  Allocation alloc{{{"a", {3, 1}}, {"b", {0, 2}}}, "10.0.0.1", 29500};
  auto ranks = assign_ranks(spec, alloc);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[1].rank, 1);
  EXPECT_EQ(ranks[1].node, "a");
  EXPECT_EQ(ranks[1].local_rank, 1);
  EXPECT_EQ(ranks[1].gpus, std::vector<int>{1});
  EXPECT_EQ(ranks[2].node_rank, 1);
  EXPECT_EQ(ranks[2].local_rank, 0);
  EXPECT_EQ(ranks[3].gpus, std::vector<int>{2});
  EXPECT_EQ(ranks[3].local_world_size, 2);
}

TEST(AssignRanks, OneProcessPerNodeSeesAllItsGpus) {
  JobSpec spec;
  spec.nodes = 1;
  spec.gpus_per_node = 4;
  spec.procs_per_node = 1;
  Allocation alloc{{{"a", {0, 1, 2, 3}}}, "10.0.0.1", 29500};
  auto ranks = assign_ranks(spec, alloc);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].gpus, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace corral::model
