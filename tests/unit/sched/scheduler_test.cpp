#include "coordinator/sched/scheduler.hpp"

#include <gtest/gtest.h>

#include "tests/unit/sched/builders.hpp"

namespace corral::sched {
namespace {

using namespace std::chrono_literals;
using model::JobState;
using testing::at_seconds;
using testing::job;
using testing::node;

constexpr const char* kA100 = "NVIDIA A100-SXM4-80GB";
constexpr const char* kH100 = "NVIDIA H100 80GB HBM3";

std::vector<JobChange> changes(const std::vector<Decision>& ds) {
  std::vector<JobChange> out;
  for (const auto& d : ds) {
    if (const auto* c = std::get_if<JobChange>(&d)) out.push_back(*c);
  }
  return out;
}

std::vector<KillRanks> kills(const std::vector<Decision>& ds) {
  std::vector<KillRanks> out;
  for (const auto& d : ds) {
    if (const auto* k = std::get_if<KillRanks>(&d)) out.push_back(*k);
  }
  return out;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void add(const model::Node& n) { ASSERT_TRUE(s_.update_node(n, now_).has_value()); }
  void submit(model::JobId id, const model::JobSpec& spec, std::string user = "alice") {
    ASSERT_TRUE(s_.add_pending(id, std::move(user), spec, now_).has_value());
    now_ += 1s;
  }
  std::vector<Decision> pass() { return s_.schedule(now_); }
  JobState state(model::JobId id) const {
    const SchedJob* j = s_.job(id);
    return j ? j->state : JobState::Completed;  // terminal jobs leave the core
  }
  PendingCode reason(model::JobId id) const { return s_.job(id)->reason.code; }
  // The event that ends the attempt (the job goes ENDING), then the agents' confirmation
  // that every rank is gone (it takes its outcome): both decisions, in order.
  Result<std::vector<Decision>> finish(model::JobId id, int attempt, JobEvent event, const EventInfo& info = {}) {
    auto first = s_.on_event(id, attempt, event, now_, info);
    if (!first) return first;
    EXPECT_EQ(s_.job(id)->state, JobState::Ending);
    auto second = s_.on_event(id, attempt, JobEvent::RanksGone, now_);
    if (!second) return second;
    first->insert(first->end(), second->begin(), second->end());
    return first;
  }
  const model::Allocation& alloc(model::JobId id) const { return *s_.job(id)->allocation; }

  Scheduler s_;
  Instant now_ = at_seconds(1000);
};

TEST_F(SchedulerTest, PlacesASingleNodeJobAndReservesTheFirstPort) {
  add(node("a").gpus(8, kA100).address("10.1.0.1"));
  submit(1, job().nodes(1, 4));
  auto cs = changes(pass());
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].to, JobState::Starting);
  EXPECT_EQ(alloc(1).master_addr, "10.1.0.1");
  EXPECT_EQ(alloc(1).master_port, 29500);
  EXPECT_EQ(alloc(1).nodes[0].gpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(s_.gpu_holder("a", 3), 1);
  EXPECT_FALSE(s_.gpu_holder("a", 4).has_value());
}

TEST_F(SchedulerTest, NeverMixesGpuClassesAcrossNodes) {
  add(node("a").gpus(4, kA100));
  add(node("b").gpus(4, kH100));
  submit(1, job().nodes(2, 4));
  EXPECT_TRUE(changes(pass()).empty());
  EXPECT_EQ(reason(1), PendingCode::NoHomogeneousSet);
  EXPECT_EQ(s_.job(1)->reason.detail,
            "no homogeneous set of 2 nodes × 4 GPUs: largest free set is 4 × NVIDIA A100-SXM4-80GB on a");
}

TEST_F(SchedulerTest, DriverVersionAloneMakesADifferentClass) {
  add(node("a").gpus(2, kA100, 81920, "550.54.15"));
  add(node("b").gpus(2, kA100, 81920, "535.104.05"));
  submit(1, job().nodes(2, 2));
  EXPECT_TRUE(changes(pass()).empty());
  EXPECT_EQ(reason(1), PendingCode::NoHomogeneousSet);
}

TEST_F(SchedulerTest, TotalGpusGoToTheFewestNodes) {
  add(node("a").gpus(4, kA100));
  add(node("b").gpus(4, kA100));
  add(node("c").gpus(8, kA100));
  submit(1, job().total(8));
  pass();
  ASSERT_EQ(alloc(1).nodes.size(), 1u);
  EXPECT_EQ(alloc(1).nodes[0].node, "c");
  submit(2, job().total(8));
  pass();
  ASSERT_EQ(alloc(2).nodes.size(), 2u);
  EXPECT_EQ(alloc(2).nodes[0].gpus.size(), 4u);
}

TEST_F(SchedulerTest, PrefersNvlinkJoinedGpusWithinANode) {
  add(node("a").gpus(8, kH100).nvlink(0, 4).nvlink(4, 4));
  submit(1, job().nodes(1, 1));
  submit(2, job().nodes(1, 4));
  pass();
  // Job 1 takes GPU 0, so 1-3 no longer form a 4-set: job 2 gets the intact island 4-7.
  EXPECT_EQ(alloc(2).nodes[0].gpus, (std::vector<int>{4, 5, 6, 7}));
}

TEST_F(SchedulerTest, GpuConstraintNarrowsTheClass) {
  add(node("a").gpus(8, kA100, 40960, "550.54.15", {12, 4}));
  add(node("b").gpus(8, kH100, 81920, "535.104.05", {12, 2}));
  submit(1, job().nodes(1, 1).model("NVIDIA H100*"));
  submit(2, job().nodes(1, 1).min_memory_mib(50000));
  submit(3, job().nodes(1, 1).min_cuda({12, 3}));
  pass();
  EXPECT_EQ(alloc(1).nodes[0].node, "b");
  EXPECT_EQ(alloc(2).nodes[0].node, "b");
  EXPECT_EQ(alloc(3).nodes[0].node, "a");
}

TEST_F(SchedulerTest, RejectsAtSubmitWhatNoNodeCouldEverRun) {
  add(node("a").gpus(8, kA100));
  auto r = s_.admissible(job().nodes(1, 16));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::ResourceExhausted);
  EXPECT_EQ(r.error().message(),
            "no node set in the cluster could ever run this job: it asks for 16 GPUs of one GPU class; the most any "
            "node has is 8 × NVIDIA A100-SXM4-80GB");
  EXPECT_FALSE(s_.admissible(job().nodes(1, 1).model("NVIDIA H100*")).has_value());
  EXPECT_TRUE(s_.admissible(job().nodes(1, 8)).has_value());
}

TEST_F(SchedulerTest, DownAndDrainedNodesStillCountForAdmission) {
  add(node("a").gpus(8, kA100).state(model::NodeState::Down));
  EXPECT_TRUE(s_.admissible(job().nodes(1, 8)).has_value());
  submit(1, job().nodes(1, 8));
  pass();
  EXPECT_EQ(reason(1), PendingCode::NodeDown);
  ASSERT_TRUE(s_.set_node_state("a", model::NodeState::Drained, "maintenance", now_).has_value());
  pass();
  EXPECT_EQ(reason(1), PendingCode::Drained);
  ASSERT_TRUE(s_.set_node_state("a", model::NodeState::Up, "", now_).has_value());
  pass();
  EXPECT_EQ(state(1), JobState::Starting);
}

TEST_F(SchedulerTest, HigherPriorityGoesFirst) {
  add(node("a").gpus(1, kA100));
  submit(1, job().nodes(1, 1));
  submit(2, job().nodes(1, 1).priority(10));
  pass();
  EXPECT_EQ(state(2), JobState::Starting);
  EXPECT_EQ(state(1), JobState::Pending);
  EXPECT_EQ(reason(1), PendingCode::Resources);
}

TEST_F(SchedulerTest, FairShareFavoursTheUserWithLessRecentGpuTime) {
  add(node("a").gpus(1, kA100));
  submit(1, job().nodes(1, 1), "alice");
  pass();
  ASSERT_EQ(state(1), JobState::Starting);
  now_ += 1h;
  submit(2, job().nodes(1, 1), "alice");
  submit(3, job().nodes(1, 1), "bob");
  ASSERT_TRUE(finish(1, 0, JobEvent::AllRanksExitedOk).has_value());
  pass();
  EXPECT_GT(s_.usage("alice"), 3000.0);
  EXPECT_EQ(state(3), JobState::Starting);  // bob first, though alice submitted earlier
  EXPECT_EQ(state(2), JobState::Pending);
}

TEST_F(SchedulerTest, FairShareUsageHalvesEveryHalfLife) {
  add(node("a").gpus(2, kA100));
  submit(1, job().nodes(1, 2));
  pass();
  now_ += 100s;
  ASSERT_TRUE(finish(1, 0, JobEvent::AllRanksExitedOk).has_value());
  pass();
  double before = s_.usage("alice");
  EXPECT_NEAR(before, 200.0, 2.0);
  now_ += 24h;
  pass();
  EXPECT_NEAR(s_.usage("alice"), before / 2, 1.0);
}

// Among equals the lower id goes first: the ledger gives ids in submission order, and an
// id, unlike a submit time read back after a restart, moves with no clock step.
TEST_F(SchedulerTest, EqualPriorityAndUsageRunInIdOrder) {
  add(node("a").gpus(1, kA100));
  submit(2, job().nodes(1, 1), "bob");
  submit(1, job().nodes(1, 1), "carol");
  pass();
  EXPECT_EQ(state(1), JobState::Starting);
  EXPECT_EQ(reason(2), PendingCode::Resources);
}

TEST_F(SchedulerTest, BackfillsAShortJobThatEndsBeforeTheHeadCanStart) {
  add(node("a").gpus(4, kA100));
  submit(1, job().nodes(1, 2).limit(1h));  // runs on 2 of 4
  pass();
  submit(2, job().nodes(1, 4).priority(10));  // head: needs all 4, can start in 1h
  submit(3, job().nodes(1, 2).limit(30min));  // ends before: may backfill
  submit(4, job().nodes(1, 2).limit(2h));     // would delay the head
  submit(5, job().nodes(1, 2));               // no limit: never on reserved GPUs
  auto cs = changes(pass());
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].job, 3);
  EXPECT_EQ(s_.last_pass().backfilled, 1);
  EXPECT_EQ(reason(2), PendingCode::Resources);
  EXPECT_EQ(reason(4), PendingCode::Priority);
  EXPECT_EQ(reason(5), PendingCode::Priority);
}

TEST_F(SchedulerTest, BackfillUsesGpusTheHeadDoesNotNeed) {
  add(node("a").gpus(4, kA100));
  add(node("b").gpus(2, kH100));
  submit(1, job().nodes(1, 2).model("NVIDIA A100*"));  // no limit
  pass();
  submit(2, job().nodes(1, 4).model("NVIDIA A100*").priority(5));  // blocked behind job 1
  submit(3, job().nodes(1, 2).model("NVIDIA H100*"));  // other class: cannot delay job 2
  pass();
  EXPECT_EQ(state(3), JobState::Starting);
  EXPECT_EQ(state(2), JobState::Pending);
}

TEST_F(SchedulerTest, NoBackfillWhenTheHeadsStartIsUnknown) {
  add(node("a").gpus(2, kA100));
  submit(1, job().nodes(1, 1));  // no limit: nobody knows when GPU 0 frees up
  pass();
  submit(2, job().nodes(1, 2).priority(5));
  submit(3, job().nodes(1, 1).limit(1min));
  pass();
  EXPECT_EQ(state(3), JobState::Pending);
  EXPECT_EQ(reason(3), PendingCode::Priority);
}

TEST_F(SchedulerTest, PortsArePerHostAndNeverShared) {
  add(node("a").gpus(8, kA100).address("10.9.0.1").ports(29500, 29501));
  add(node("a2").gpus(8, kA100).address("10.9.0.1").ports(29500, 29501));  // same machine
  for (int i = 1; i <= 3; ++i) submit(i, job().nodes(1, 1));
  pass();
  EXPECT_EQ(alloc(1).master_port, 29500);
  EXPECT_EQ(alloc(2).master_port, 29501);
  EXPECT_EQ(state(3), JobState::Pending);
  EXPECT_EQ(s_.job(3)->reason.detail, "no free master port on the chosen nodes");
  ASSERT_TRUE(finish(1, 0, JobEvent::AllRanksExitedOk).has_value());
  pass();
  EXPECT_EQ(alloc(3).master_port, 29500);
  EXPECT_EQ(s_.port_holder("10.9.0.1", 29500), 3);
}

TEST_F(SchedulerTest, BusyPortIsSkippedForAWhileAndTheJobPlacedAgain) {
  add(node("a").gpus(8, kA100));
  submit(1, job().nodes(1, 1));
  pass();
  ASSERT_EQ(alloc(1).master_port, 29500);
  auto ds = s_.on_event(1, 0, JobEvent::PortBusy, now_);
  ASSERT_TRUE(ds.has_value());
  EXPECT_TRUE(kills(*ds).empty());  // nothing was launched yet
  EXPECT_EQ(state(1), JobState::Pending);
  EXPECT_EQ(s_.job(1)->attempt, 0);
  pass();
  EXPECT_EQ(alloc(1).master_port, 29501);
  EXPECT_TRUE(finish(1, 0, JobEvent::AllRanksExitedOk).has_value());
  submit(2, job().nodes(1, 1));
  pass();
  EXPECT_EQ(alloc(2).master_port, 29501);  // 29500 still marked busy
  now_ += 11min;
  submit(3, job().nodes(1, 1));
  pass();
  EXPECT_EQ(alloc(3).master_port, 29500);
}

TEST_F(SchedulerTest, RankFailureTearsTheGangDownAndFreesEverything) {
  add(node("a").gpus(2, kA100));
  add(node("b").gpus(2, kA100));
  submit(1, job().nodes(2, 2));
  pass();
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::AllRanksStarted, now_).has_value());
  EventInfo info{3, "b", 1, ""};
  auto ds = s_.on_event(1, 0, JobEvent::RankFailed, now_, info);
  ASSERT_TRUE(ds.has_value());
  auto cs = changes(*ds);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].to, JobState::Ending);
  EXPECT_EQ(cs[0].outcome, JobState::Failed);
  EXPECT_EQ(cs[0].text, "RUNNING -> ENDING (FAILED once every rank is gone): rank 3 on b exited with code 1");
  ASSERT_EQ(kills(*ds).size(), 1u);
  EXPECT_EQ(kills(*ds)[0].nodes, (std::vector<std::string>{"a", "b"}));
  // Decided, but its GPUs and port stay held until every rank is confirmed gone.
  model::Allocation held = alloc(1);
  EXPECT_EQ(s_.gpu_holder("a", 0), 1);
  EXPECT_EQ(s_.port_holder(held.master_addr, held.master_port), 1);
  ds = s_.on_event(1, 0, JobEvent::RanksGone, now_);
  ASSERT_TRUE(ds.has_value());
  cs = changes(*ds);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].to, JobState::Failed);
  EXPECT_EQ(cs[0].text, "ENDING -> FAILED");
  EXPECT_TRUE(kills(*ds).empty());
  EXPECT_EQ(s_.job(1), nullptr);
  EXPECT_FALSE(s_.gpu_holder("a", 0).has_value());
  EXPECT_FALSE(s_.port_holder(held.master_addr, held.master_port).has_value());
}

TEST_F(SchedulerTest, EndingJobsGpusGoNodeByNodeAsEachIsConfirmed) {
  add(node("a").gpus(2, kA100).address("10.3.0.1"));
  add(node("b").gpus(2, kA100).address("10.3.0.2"));
  submit(1, job().nodes(2, 2));
  pass();
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::AllRanksStarted, now_).has_value());
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::Cancel, now_).has_value());
  submit(2, job().nodes(1, 2));
  EXPECT_TRUE(changes(pass()).empty());  // every GPU still held by the ending job
  EXPECT_EQ(reason(2), PendingCode::Resources);
  ASSERT_TRUE(s_.release_node(1, "b", now_).has_value());
  EXPECT_FALSE(s_.gpu_holder("b", 0).has_value());
  EXPECT_EQ(s_.gpu_holder("a", 0), 1);
  EXPECT_EQ(s_.port_holder("10.3.0.1", 29500), 1);  // the port lives on a, not confirmed yet
  auto cs = changes(pass());
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(alloc(2).nodes[0].node, "b");
  // A job that is not ENDING releases nothing that way; an ENDING job takes no other event.
  EXPECT_FALSE(s_.release_node(2, "b", now_).has_value());
  EXPECT_FALSE(s_.on_event(1, 0, JobEvent::Cancel, now_).has_value());
  EXPECT_FALSE(s_.on_event(1, 0, JobEvent::NodeLost, now_).has_value());
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::RanksGone, now_).has_value());
  EXPECT_EQ(state(1), JobState::Completed);  // gone from the core
  EXPECT_FALSE(s_.port_holder("10.3.0.1", 29500).has_value());
}

TEST_F(SchedulerTest, ALostNodesGpusAreFencedWhileTheJobIsRequeuedElsewhere) {
  add(node("a").gpus(1, kA100).address("10.4.0.1"));
  add(node("b").gpus(1, kA100).address("10.4.0.2"));
  add(node("c").gpus(1, kA100).address("10.4.0.3"));
  submit(1, job().nodes(2, 1).retries(1));
  pass();
  const std::string master = alloc(1).nodes[0].node;
  const std::string other = alloc(1).nodes[1].node;
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::AllRanksStarted, now_).has_value());
  auto ds = s_.set_node_state(master, model::NodeState::Down, "heartbeat timeout", now_);
  ASSERT_TRUE(ds.has_value());
  EXPECT_EQ(changes(*ds)[0].outcome, JobState::Pending);
  auto fence = s_.fence_node(1, master, now_);
  ASSERT_TRUE(fence.has_value());
  EXPECT_EQ(fence->node, master);
  EXPECT_EQ(fence->port, 29500);  // rank 0 ran there
  EXPECT_FALSE(s_.fence_node(1, master, now_).has_value());  // once
  ASSERT_TRUE(s_.release_node(1, other, now_).has_value());
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::RanksGone, now_).has_value());
  EXPECT_EQ(s_.job(1)->attempt, 1);
  // The fence outlives the attempt: the master's GPU and port serve nobody, even back up.
  ASSERT_TRUE(s_.set_node_state(master, model::NodeState::Up, "", now_).has_value());
  EXPECT_EQ(s_.gpu_holder(master, 0), 1);
  auto fence_host = fence->host;
  EXPECT_EQ(s_.port_holder(fence_host, 29500), 1);
  submit(2, job().nodes(1, 1));
  pass();
  EXPECT_EQ(state(1), JobState::Starting);  // attempt 1 on the two nodes left
  EXPECT_EQ(state(2), JobState::Pending);
  for (const auto& na : alloc(1).nodes) EXPECT_NE(na.node, master);
  EXPECT_FALSE(s_.lift_fence(1, 1, master));  // not that attempt
  EXPECT_TRUE(s_.lift_fence(1, 0, master));
  EXPECT_TRUE(s_.fences().empty());
  EXPECT_FALSE(s_.gpu_holder(master, 0).has_value());
  pass();
  EXPECT_EQ(state(2), JobState::Starting);
  EXPECT_EQ(alloc(2).nodes[0].node, master);
  // A fence reloaded after a restart holds again, and refuses what is taken.
  ASSERT_TRUE(s_.restore_fence({7, 0, "a", {}, "10.4.0.1", 29999}).has_value());
  EXPECT_EQ(s_.port_holder("10.4.0.1", 29999), 7);
  EXPECT_FALSE(s_.restore_fence({8, 0, master, {0}, "", 0}).has_value());
}

TEST_F(SchedulerTest, AFenceOnAnyNodeHoldsTheMasterPortItsRanksMayStillReach) {
  add(node("a").gpus(1, kA100).address("10.4.0.1").ports(29500, 29501));
  add(node("b").gpus(1, kA100).address("10.4.0.2").ports(29500, 29501));
  submit(1, job().nodes(2, 1));
  pass();
  const std::string master = alloc(1).nodes[0].node;
  const std::string other = alloc(1).nodes[1].node;
  const std::string host = alloc(1).master_addr;
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::AllRanksStarted, now_).has_value());
  ASSERT_TRUE(s_.set_node_state(other, model::NodeState::Down, "heartbeat timeout", now_).has_value());
  auto fence = s_.fence_node(1, other, now_);
  ASSERT_TRUE(fence.has_value());
  EXPECT_EQ(fence->host, host);
  EXPECT_EQ(fence->port, 29500);
  // The master node confirms; the job ends; the lost node's ranks may still reach the port.
  ASSERT_TRUE(s_.release_node(1, master, now_).has_value());
  EXPECT_EQ(s_.port_holder(host, 29500), 1);
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::RanksGone, now_).has_value());
  EXPECT_EQ(s_.port_holder(host, 29500), 1);
  submit(2, job().nodes(1, 1));
  pass();
  ASSERT_EQ(state(2), JobState::Starting);
  EXPECT_EQ(alloc(2).nodes[0].node, master);
  EXPECT_EQ(alloc(2).master_port, 29501);
  EXPECT_TRUE(s_.lift_fence(1, 0, other));
  EXPECT_FALSE(s_.port_holder(host, 29500).has_value());
}

TEST_F(SchedulerTest, UnreachableNodeGetsNoJobAndIsNamedAsNodeDown) {
  add(node("a").gpus(2, kA100));
  add(node("b").gpus(2, kA100));
  ASSERT_TRUE(s_.set_reachable("b", false).has_value());
  submit(1, job().nodes(2, 2));
  EXPECT_TRUE(changes(pass()).empty());
  EXPECT_EQ(reason(1), PendingCode::NodeDown);
  EXPECT_EQ(s_.job(1)->reason.detail, "fits only when down nodes return: b (agent not connected)");
  submit(2, job().nodes(1, 2));
  auto cs = changes(pass());
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(alloc(2).nodes[0].node, "a");
  ASSERT_TRUE(s_.set_reachable("b", true).has_value());
  EXPECT_FALSE(s_.set_reachable("nope", true).has_value());
}

TEST_F(SchedulerTest, RetriesRequeueWithTheNextAttempt) {
  add(node("a").gpus(1, kA100));
  add(node("b").gpus(1, kA100));
  submit(1, job().nodes(1, 1).retries(1));
  pass();
  std::string first = alloc(1).nodes[0].node;
  auto ds = s_.set_node_state(first, model::NodeState::Down, "heartbeat timeout", now_);
  ASSERT_TRUE(ds.has_value());
  auto cs = changes(*ds);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].to, JobState::Ending);
  EXPECT_EQ(cs[0].outcome, JobState::Pending);
  EXPECT_EQ(cs[0].attempt, 0);
  EXPECT_TRUE(kills(*ds).empty());  // the only node is the lost one
  // The lost node's rank is not confirmed dead: the requeue waits for that.
  ds = s_.on_event(1, 0, JobEvent::RanksGone, now_);
  ASSERT_TRUE(ds.has_value());
  cs = changes(*ds);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].to, JobState::Pending);
  EXPECT_EQ(cs[0].attempt, 1);
  pass();
  EXPECT_NE(alloc(1).nodes[0].node, first);
  // Stale reports from attempt 0 are refused.
  EXPECT_FALSE(s_.on_event(1, 0, JobEvent::AllRanksExitedOk, now_).has_value());
  // No retries left: the next loss is final.
  ds = s_.set_node_state(alloc(1).nodes[0].node, model::NodeState::Down, "", now_);
  EXPECT_EQ(changes(*ds)[0].outcome, JobState::NodeFail);
}

TEST_F(SchedulerTest, NodeLossKillsTheJobOnTheOtherNodes) {
  add(node("a").gpus(1, kA100));
  add(node("b").gpus(1, kA100));
  submit(1, job().nodes(2, 1));
  pass();
  auto ds = s_.set_node_state("b", model::NodeState::Down, "heartbeat timeout", now_);
  ASSERT_TRUE(ds.has_value());
  EXPECT_EQ(changes(*ds)[0].outcome, JobState::NodeFail);
  EXPECT_EQ(changes(*ds)[0].text, "STARTING -> ENDING (NODE_FAIL once every rank is gone): node b lost: heartbeat timeout");
  ASSERT_EQ(kills(*ds).size(), 1u);
  EXPECT_EQ(kills(*ds)[0].nodes, std::vector<std::string>{"a"});
}

TEST_F(SchedulerTest, TimeLimitEndsTheJobAsTimeout) {
  add(node("a").gpus(1, kA100));
  submit(1, job().nodes(1, 1).limit(10min));
  pass();
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::AllRanksStarted, now_).has_value());
  now_ += 9min;
  EXPECT_TRUE(changes(pass()).empty());
  now_ += 1min;
  auto ds = pass();
  auto cs = changes(ds);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].outcome, JobState::Timeout);
  EXPECT_EQ(cs[0].text, "RUNNING -> ENDING (TIMEOUT once every rank is gone): time limit 10m reached");
  EXPECT_EQ(kills(ds).size(), 1u);
  now_ += 1h;
  EXPECT_TRUE(changes(pass()).empty());  // an ENDING job's time limit is behind it
}

TEST_F(SchedulerTest, CancelOfAPendingJobKillsNothing) {
  add(node("a").gpus(1, kA100));
  submit(1, job().nodes(1, 1));
  auto ds = s_.on_event(1, 0, JobEvent::Cancel, now_);
  ASSERT_TRUE(ds.has_value());
  EXPECT_EQ(changes(*ds)[0].to, JobState::Cancelled);
  EXPECT_TRUE(kills(*ds).empty());
  EXPECT_FALSE(s_.on_event(1, 0, JobEvent::Cancel, now_).has_value());  // gone
}

TEST_F(SchedulerTest, RestoredJobsHoldTheirGpusAndPortsAgain) {
  add(node("a").gpus(2, kA100).address("10.2.0.1"));
  SchedJob j;
  j.id = 7;
  j.user = "alice";
  j.spec = job().nodes(1, 1);
  j.state = JobState::Running;
  j.started_at = now_;
  j.allocation = model::Allocation{{{"a", {1}}}, "10.2.0.1", 29500};
  ASSERT_TRUE(s_.restore_active(j).has_value());
  EXPECT_EQ(s_.gpu_holder("a", 1), 7);
  SchedJob clash = j;
  clash.id = 8;
  auto r = s_.restore_active(clash);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  submit(9, job().nodes(1, 1));
  pass();
  EXPECT_EQ(alloc(9).nodes[0].gpus, std::vector<int>{0});
  EXPECT_EQ(alloc(9).master_port, 29501);
}

TEST_F(SchedulerTest, RestoredEndingJobKeepsItsOutcomeAndItsHolds) {
  add(node("a").gpus(2, kA100).address("10.2.0.1"));
  SchedJob j;
  j.id = 7;
  j.user = "alice";
  j.spec = job().nodes(1, 2).retries(1);
  j.state = JobState::Ending;
  j.allocation = model::Allocation{{{"a", {0, 1}}}, "10.2.0.1", 29500};
  SchedJob no_outcome = j;
  EXPECT_FALSE(s_.restore_active(no_outcome).has_value());
  j.outcome = JobState::Pending;
  ASSERT_TRUE(s_.restore_active(j).has_value());
  EXPECT_EQ(s_.gpu_holder("a", 0), 7);
  EXPECT_TRUE(changes(pass()).empty());
  auto ds = s_.on_event(7, 0, JobEvent::RanksGone, now_);
  ASSERT_TRUE(ds.has_value());
  EXPECT_EQ(changes(*ds)[0].to, JobState::Pending);
  EXPECT_EQ(s_.job(7)->attempt, 1);
  EXPECT_FALSE(s_.gpu_holder("a", 0).has_value());
}

TEST_F(SchedulerTest, ARestoredEndingJobDoesNotClaimTheNodesItReleasedBeforeTheRestart) {
  // Job 7 was ENDING with node b confirmed (its GPU free; the port stays with job 7 until
  // it ends); job 5 took the GPU. After a restart job 5 is restored first, by id: job 7
  // must still restore.
  add(node("a").gpus(1, kA100).address("10.5.0.1"));
  add(node("b").gpus(1, kA100).address("10.5.0.2"));
  SchedJob five;
  five.id = 5;
  five.user = "alice";
  five.spec = job().nodes(1, 1);
  five.state = JobState::Running;
  five.allocation = model::Allocation{{{"b", {0}}}, "10.5.0.2", 29501};
  ASSERT_TRUE(s_.restore_active(five).has_value());
  SchedJob seven;
  seven.id = 7;
  seven.user = "bob";
  seven.spec = job().nodes(2, 1);
  seven.state = JobState::Ending;
  seven.outcome = JobState::Completed;
  seven.allocation = model::Allocation{{{"b", {0}}, {"a", {0}}}, "10.5.0.2", 29500};
  seven.released_nodes = {"b"};
  ASSERT_TRUE(s_.restore_active(seven).has_value());
  EXPECT_EQ(s_.gpu_holder("b", 0), 5);
  EXPECT_EQ(s_.gpu_holder("a", 0), 7);
  EXPECT_EQ(s_.port_holder("10.5.0.2", 29500), 7);
  ASSERT_TRUE(s_.on_event(7, 0, JobEvent::RanksGone, now_).has_value());
  EXPECT_FALSE(s_.gpu_holder("a", 0).has_value());
  EXPECT_EQ(s_.gpu_holder("b", 0), 5);  // not job 7's to free
  EXPECT_FALSE(s_.port_holder("10.5.0.2", 29500).has_value());
  EXPECT_EQ(s_.port_holder("10.5.0.2", 29501), 5);
}

TEST_F(SchedulerTest, DryRunSaysWhereOrWhy) {
  add(node("a").gpus(4, kA100));
  auto ok = s_.dry_run(job().nodes(1, 4), "alice", now_);
  ASSERT_TRUE(ok.allocation.has_value());
  EXPECT_EQ(ok.allocation->nodes[0].node, "a");
  auto wait = s_.dry_run(job().nodes(2, 4), "alice", now_);
  EXPECT_FALSE(wait.allocation.has_value());
  EXPECT_EQ(wait.reason.code, PendingCode::NoHomogeneousSet);
}

TEST_F(SchedulerTest, RejectsBadNodeReports) {
  model::Node n = node("big").gpus(65, kA100);
  EXPECT_FALSE(s_.update_node(n, now_).has_value());
  model::Node dup = node("dup").gpus(2, kA100);
  dup.gpus[1].index = 0;
  EXPECT_FALSE(s_.update_node(dup, now_).has_value());
  model::Node ports = node("p").gpus(1, kA100).ports(30000, 29000);
  EXPECT_FALSE(s_.update_node(ports, now_).has_value());
  EXPECT_TRUE(s_.nodes().empty());
}

TEST_F(SchedulerTest, ProcsPerNodeShapesTheRanksNotThePlacement) {
  add(node("a").gpus(4, kA100));
  submit(1, job().nodes(1, 4).procs(1));
  pass();
  auto ranks = model::assign_ranks(s_.job(1)->spec, alloc(1));
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].gpus.size(), 4u);
}

TEST_F(SchedulerTest, MightStartNowIsFalseOnlyWhenAPassWouldNotStartTheJob) {
  add(node("a").gpus(8, kA100).address("10.1.0.1"));
  submit(1, job().nodes(1, 8));
  EXPECT_TRUE(s_.might_start_now(1));
  ASSERT_EQ(changes(pass()).size(), 1u);  // job 1 holds every GPU
  submit(2, job().nodes(1, 1));
  EXPECT_FALSE(s_.might_start_now(2));
  EXPECT_EQ(reason(2), PendingCode::Resources);  // given as a pass would
  EXPECT_TRUE(changes(pass()).empty());           // and a pass indeed starts nothing
  ASSERT_TRUE(s_.on_event(1, 0, JobEvent::AllRanksStarted, now_).has_value());
  ASSERT_TRUE(finish(1, 0, JobEvent::AllRanksExitedOk).has_value());
  EXPECT_TRUE(s_.might_start_now(2));  // GPUs free again
  EXPECT_FALSE(s_.might_start_now(1));  // not pending
  EXPECT_FALSE(s_.might_start_now(99));
}

TEST_F(SchedulerTest, MightStartNowWithNoNodeSaysSo) {
  submit(1, job().nodes(1, 1));
  EXPECT_FALSE(s_.might_start_now(1));
  EXPECT_EQ(s_.job(1)->reason.detail, "no node has joined the cluster");
}

}  // namespace
}  // namespace corral::sched
