#include "coordinator/sched/capacity.hpp"

#include <gtest/gtest.h>

namespace corral::sched {
namespace {

// Table-driven: free GPUs per node of one class, a gang shape, and the nodes best fit picks.
struct PlacementCase {
  std::string name;
  std::vector<int> free_per_node;
  int nodes;
  int per_node;
  std::vector<int> expected_nodes;  // empty: no placement
};

class PlacementTable : public ::testing::TestWithParam<PlacementCase> {};

TEST_P(PlacementTable, PicksTheBestFittingNodes) {
  const auto& c = GetParam();
  Capacity cap(static_cast<int>(c.free_per_node.size()), 1, 8);
  std::vector<NodeLayout> layouts(c.free_per_node.size());
  for (std::size_t n = 0; n < c.free_per_node.size(); ++n) {
    for (int p = 0; p < c.free_per_node[n]; ++p) cap.add_free(static_cast<int>(n), 0, p);
  }
  auto p = place_in_class(cap, layouts, 0, c.nodes, c.per_node);
  if (c.expected_nodes.empty()) {
    EXPECT_FALSE(p.has_value());
    return;
  }
  ASSERT_TRUE(p.has_value());
  std::vector<int> got;
  for (const auto& pn : p->nodes) {
    got.push_back(pn.node);
    EXPECT_EQ(popcount(pn.gpus), c.per_node);
  }
  EXPECT_EQ(got, c.expected_nodes);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlacementTable,
    ::testing::Values(
        PlacementCase{"SingleNodeExactFit", {8}, 1, 8, {0}},
        PlacementCase{"PrefersTheFullerNodeForSmallJobs", {8, 2}, 1, 2, {1}},
        PlacementCase{"SkipsNodesTooSmall", {1, 3, 8}, 1, 3, {1}},
        PlacementCase{"TwoNodesSmallestThatFit", {8, 4, 4, 6}, 2, 4, {1, 2}},
        PlacementCase{"NotEnoughNodes", {4, 4}, 3, 4, {}},
        PlacementCase{"NoNodeLargeEnough", {4, 4, 4}, 1, 8, {}},
        PlacementCase{"ZeroFreeIsNoCandidate", {0, 0, 2}, 1, 1, {2}},
        PlacementCase{"TieGoesToLowerSlot", {4, 4}, 1, 4, {0}},
        PlacementCase{"UsesLargerNodesWhenSmallRunOut", {2, 8, 8}, 2, 2, {0, 1}},
        PlacementCase{"EmptyCluster", {}, 1, 1, {}}),
    [](const auto& param_info) { return param_info.param.name; });

TEST(Capacity, CountsNodesWithAtLeastKFreeAsGpusComeAndGo) {
  Capacity cap(3, 1, 8);
  for (int p = 0; p < 4; ++p) cap.add_free(0, 0, p);
  for (int p = 0; p < 2; ++p) cap.add_free(1, 0, p);
  EXPECT_EQ(cap.nodes_with_at_least(0, 1), 2);
  EXPECT_EQ(cap.nodes_with_at_least(0, 2), 2);
  EXPECT_EQ(cap.nodes_with_at_least(0, 3), 1);
  EXPECT_EQ(cap.nodes_with_at_least(0, 5), 0);
  cap.take(0, 0, 0);
  cap.take(0, 0, 1);
  EXPECT_EQ(cap.nodes_with_at_least(0, 3), 0);
  EXPECT_EQ(cap.free_total(0), 4);
  cap.take(0, 0, 1);  // taking a taken GPU changes nothing
  EXPECT_EQ(cap.free_total(0), 4);
  cap.add_free(0, 0, 0);
  EXPECT_EQ(cap.nodes_with_at_least(0, 3), 1);
}

TEST(Capacity, ClassesAreCountedApart) {
  Capacity cap(1, 2, 8);
  cap.add_free(0, 0, 0);
  cap.add_free(0, 1, 1);
  EXPECT_EQ(cap.nodes_with_at_least(0, 2), 0);
  EXPECT_EQ(cap.nodes_with_at_least(1, 1), 1);
}

TEST(PickGpus, PrefersAnNvlinkIsland) {
  // GPUs 0-3 and 4-7 are two NVLink islands; 1 and 2 are taken.
  std::vector<GpuMask> nvlink(8, 0);
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      if (i != j && (i < 4) == (j < 4)) nvlink[static_cast<std::size_t>(i)] |= GpuMask{1} << j;
    }
  }
  GpuMask free = 0xFF & ~GpuMask{0b0110};
  EXPECT_EQ(pick_gpus(free, 3, nvlink), GpuMask{0b01110000});
  EXPECT_EQ(pick_gpus(free, 2, nvlink), GpuMask{0b1001});
}

TEST(PickGpus, WithoutNvlinkTakesTheLowestPositions) {
  EXPECT_EQ(pick_gpus(0b11110, 2, {}), GpuMask{0b00110});
  EXPECT_EQ(pick_gpus(0b101, 2, {}), GpuMask{0b101});
}

}  // namespace
}  // namespace corral::sched
