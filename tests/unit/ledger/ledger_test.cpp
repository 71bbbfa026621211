// The ledger alone: calls in, effects out, time passed in, a MemoryStore as its disk.

#include "coordinator/ledger/ledger.hpp"

#include <gtest/gtest.h>

#include <spdlog/spdlog.h>

#include "common/model/job_spec_yaml.hpp"
#include "coordinator/store/memory_store.hpp"

namespace corral::ledger {
namespace {

using namespace std::chrono_literals;
using model::JobState;

protocol::Hello hello(const std::string& node, int gpus) {
  protocol::Hello h;
  h.node = node;
  h.address = "10.0.0." + std::string(node == "a" ? "1" : "2");
  h.ports = {29500, 29509};
  h.simulated = true;
  for (int i = 0; i < gpus; ++i) {
    model::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + node + std::to_string(i);
    g.cls = {"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"};
    g.cuda = {12, 4};
    h.gpus.push_back(g);
  }
  return h;
}

class LedgerTest : public ::testing::Test {
 protected:
  LedgerTest() { spdlog::set_level(spdlog::level::off); }

  // Commits what the ledger changed, keeps what it sent.
  void commit() {
    Effects e = ledger_->take();
    for (const auto& r : store_.commit(e.changes)) ASSERT_TRUE(r.has_value()) << r.error().message();
    for (auto& m : e.messages) sent_.push_back(std::move(m));
    for (auto id : e.ended) ended_.push_back(id);
    for (auto& c : e.close) closed_.push_back(c.first);
  }
  template <typename T>
  std::vector<T> sent_to(const std::string& node) {
    std::vector<T> out;
    for (const auto& m : sent_) {
      if (m.node == node) {
        if (const auto* t = std::get_if<T>(&m.message)) out.push_back(*t);
      }
    }
    return out;
  }
  void join(const std::string& node, protocol::Hello h) {
    ASSERT_TRUE(ledger_->agent_hello(node, std::move(h), now_).has_value());
    ledger_->agent_message(node, protocol::Synced{}, now_);
    commit();
  }
  void say(const std::string& node, const protocol::AgentMessage& m) {
    ledger_->agent_message(node, m, now_);
    commit();
  }
  // Alice submits this spec; what it changes is not committed yet.
  auto submit_spec(const std::string& text) {
    auto spec = model::parse_job_spec(text, "t.yaml");
    EXPECT_TRUE(spec.has_value()) << spec.error().message();
    return ledger_->submit("alice", *spec, text, now_);
  }
  model::JobId submit(int nodes, int gpus, const std::string& more = "") {
    std::string text = "name: t\ncommand: \"true\"\nresources: {nodes: " + std::to_string(nodes) +
                       ", gpus_per_node: " + std::to_string(gpus) + "}\n" + more;
    auto s = submit_spec(text);
    EXPECT_TRUE(s.has_value());
    EXPECT_TRUE(store_.commit(s->change).has_value());
    ledger_->schedule(now_);
    commit();
    return s->id;
  }
  // Prepare answered, every rank started: the job RUNNING on a (ranks 0, 1) and b (2, 3).
  model::JobId running_two_by_two(const std::string& more = "") {
    model::JobId id = submit(2, 2, more);
    EXPECT_EQ(sent_to<protocol::Prepare>("a").size(), 1u);
    say("a", protocol::PrepareResult{id, 0, true, false, "", "", 29500});
    EXPECT_EQ(sent_to<protocol::Launch>("b").size(), 1u);
    for (int r = 0; r < 4; ++r) say(r < 2 ? "a" : "b", protocol::RankStarted{id, 0, r, 100 + r});
    EXPECT_EQ(state(id), JobState::Running);
    return id;
  }
  // Both nodes joined; a 2 x 2 job ran, every rank exited 0 and both agents confirmed.
  void completed_two_by_two(model::JobId& id) {
    join("a", hello("a", 2));
    join("b", hello("b", 2));
    id = running_two_by_two();
    for (int r = 0; r < 4; ++r) say(r < 2 ? "a" : "b", protocol::RankExited{id, 0, r, 0, 0, "", false});
    say("a", protocol::AttemptGone{id, 0});
    say("b", protocol::AttemptGone{id, 0});
    ASSERT_EQ(state(id), JobState::Completed);
  }
  // Time passes by seconds: the `beating` agents send heartbeats, the coordinator ticks
  // (and, with `passes`, runs its scheduling passes) and commits.
  void beats(Duration d, const std::vector<std::string>& beating, bool passes = false) {
    for (Duration t = Duration::zero(); t < d; t += 1s) {
      now_ += 1s;
      for (const auto& node : beating) ledger_->agent_message(node, protocol::Heartbeat{}, now_);
      ledger_->tick(now_);
      if (passes) ledger_->schedule(now_);
      commit();
    }
  }
  // `node` ("a" or "b") says hello listing its ranks of running_two_by_two's job `id`
  // (a: 0 and 1, b: 2 and 3), attempt 0, and syncs.
  void rejoin(const std::string& node, model::JobId id) {
    auto h = hello(node, 2);
    const int first = node == "a" ? 0 : 2;
    h.running = {{id, 0, first, 100 + first}, {id, 0, first + 1, 101 + first}};
    join(node, h);
  }
  JobState state(model::JobId id) {
    auto rec = store_.job(id);
    return rec && *rec ? (*rec)->state : JobState::Pending;
  }
  void restart() {
    auto snap = store_.load();
    ASSERT_TRUE(snap.has_value());
    ledger_ = std::make_unique<Ledger>(config_);
    ASSERT_TRUE(ledger_->restore(*snap, now_).has_value());
    commit();
    sent_.clear();
  }

  model::CoordinatorConfig config_;
  store::MemoryStore store_;
  std::unique_ptr<Ledger> ledger_ = std::make_unique<Ledger>(config_);
  // The two clocks far apart, so that a date taken for a deadline (or the other way round) shows.
  Now now_{TimePoint(std::chrono::hours(1000)), instant_from_millis(7'000'000)};
  std::vector<Outgoing> sent_;
  std::vector<model::JobId> ended_;
  std::vector<std::string> closed_;  // links the ledger asked to close
};

TEST_F(LedgerTest, ACompletedJobHoldsItsGpusUntilEveryNodeConfirmsItsRanksGone) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = running_two_by_two();
  for (int r = 0; r < 4; ++r) say(r < 2 ? "a" : "b", protocol::RankExited{id, 0, r, 0, 0, "exited with code 0", false});
  EXPECT_EQ(state(id), JobState::Ending);
  EXPECT_EQ((*store_.job(id))->outcome, JobState::Completed);
  EXPECT_TRUE(sent_to<protocol::Kill>("a").empty());  // they ended by themselves
  EXPECT_EQ(ledger_->scheduler().gpu_holder("b", 1), id);
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_FALSE(ledger_->scheduler().gpu_holder("b", 1).has_value());
  EXPECT_EQ(ledger_->scheduler().gpu_holder("a", 0), id);
  EXPECT_TRUE(ended_.empty());
  say("a", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::Completed);
  EXPECT_EQ(ended_, std::vector<model::JobId>{id});
  EXPECT_FALSE(ledger_->scheduler().gpu_holder("a", 0).has_value());
}

// After an outage the ranks' ends reach the coordinator late: the job's end is the last of
// them as the agents dated them, not the moment it heard (which accounting would follow).
TEST_F(LedgerTest, AJobEndsWhenItsLastRankEndedAsItsAgentsDatedItNotWhenTheCoordinatorHeard) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = running_two_by_two();
  const TimePoint started = now_.wall;
  now_ += std::chrono::hours(1);  // the reports were held back for an hour
  for (int r = 0; r < 4; ++r) {
    protocol::RankExited m{id, 0, r, 0, 0, "exited with code 0", false};
    m.ended_at_ms = to_millis(started + std::chrono::minutes(10) + std::chrono::seconds(r));
    say(r < 2 ? "a" : "b", m);
  }
  say("a", protocol::AttemptGone{id, 0});
  say("b", protocol::AttemptGone{id, 0});
  auto rec = *store_.job(id);
  ASSERT_EQ(rec->state, JobState::Completed);
  EXPECT_EQ(rec->ended_at, started + std::chrono::minutes(10) + std::chrono::seconds(3));
  EXPECT_EQ(rec->ranks[1].ended_at, started + std::chrono::minutes(10) + std::chrono::seconds(1));
}

TEST_F(LedgerTest, ARankEndDatedOutsideItsRunIsClampedAndAnUndatedOneIsDatedWhenHeard) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = running_two_by_two();
  const TimePoint started = now_.wall;
  now_ += std::chrono::minutes(5);
  auto exited = [&](int r, std::int64_t at_ms) {
    protocol::RankExited m{id, 0, r, 0, 0, "exited with code 0", false};
    m.ended_at_ms = at_ms;
    say(r < 2 ? "a" : "b", m);
  };
  exited(0, to_millis(started - std::chrono::hours(2)));  // a node clock behind
  exited(1, to_millis(now_.wall + std::chrono::hours(2)));     // a node clock ahead
  exited(2, 0);                                           // an older agent: no date
  exited(3, to_millis(started + std::chrono::minutes(1)));
  auto ranks = (*store_.job(id))->ranks;
  EXPECT_EQ(ranks[0].ended_at, started);
  EXPECT_EQ(ranks[1].ended_at, now_.wall);
  EXPECT_EQ(ranks[2].ended_at, now_.wall);
  EXPECT_EQ(ranks[3].ended_at, started + std::chrono::minutes(1));
  say("a", protocol::AttemptGone{id, 0});
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_EQ((*store_.job(id))->ended_at, now_.wall);
}

// How many UpdateJob of `id` a list of changes holds, and the last one's record.
std::pair<int, std::optional<store::JobRecord>> updates_of(const std::vector<store::Change>& changes,
                                                           model::JobId id) {
  std::pair<int, std::optional<store::JobRecord>> out{0, std::nullopt};
  for (const auto& c : changes) {
    for (const auto& m : c.mutations) {
      if (const auto* u = std::get_if<store::UpdateJob>(&m); u != nullptr && u->job.id == id) {
        ++out.first;
        out.second = u->job;
      }
    }
  }
  return out;
}

TEST_F(LedgerTest, RankReportsLeaveOneWriteOfTheLatestRecordPerBatchWhenDeferred) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = submit(2, 2);
  say("a", protocol::PrepareResult{id, 0, true, false, "", "", 29500});
  // Three ranks start, each its own report and its own take, as the coordinator does.
  std::vector<store::Change> taken;
  for (int r = 0; r < 3; ++r) {
    ledger_->agent_message(r < 2 ? "a" : "b", protocol::RankStarted{id, 0, r, 100 + r}, now_);
    Effects e = ledger_->take(/*defer_rank_records=*/true);
    for (auto& c : e.changes) taken.push_back(std::move(c));
  }
  EXPECT_EQ(updates_of(taken, id).first, 0) << "a rank's pid copied the record at once";
  EXPECT_TRUE(ledger_->rank_records_due());
  auto records = ledger_->take_rank_records();
  auto [writes, record] = updates_of(records, id);
  EXPECT_EQ(writes, 1);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->ranks[0].pid, 100);
  EXPECT_EQ(record->ranks[2].pid, 102);
  EXPECT_EQ(record->ranks[3].pid, 0);
  EXPECT_FALSE(ledger_->rank_records_due());
  EXPECT_TRUE(ledger_->take_rank_records().empty());
  for (const auto& r : store_.commit(taken)) ASSERT_TRUE(r.has_value());
  for (const auto& r : store_.commit(records)) ASSERT_TRUE(r.has_value());
  EXPECT_EQ((*store_.job(id))->ranks[2].pid, 102);
  // The last rank starts the job: STARTING -> RUNNING is written whole, ranks and all, and
  // leaves no second write behind.
  ledger_->agent_message("b", protocol::RankStarted{id, 0, 3, 103}, now_);
  Effects e = ledger_->take(true);
  auto [full, running] = updates_of(e.changes, id);
  EXPECT_EQ(full, 1);
  ASSERT_TRUE(running.has_value());
  EXPECT_EQ(running->state, JobState::Running);
  EXPECT_EQ(running->ranks[3].pid, 103);
  EXPECT_FALSE(ledger_->rank_records_due());
}

TEST_F(LedgerTest, ARankRecordNotYetWrittenIsWrittenWhenItsEndedJobIsLetGo) {
  model::JobId id = 0;
  ASSERT_NO_FATAL_FAILURE(completed_two_by_two(id));
  // A report about the ended job's ranks that came late (a start, repeated), left for the
  // batch, and the window passes before the batch is written: the ledger writes it as it
  // lets the job go.
  ledger_->agent_message("a", protocol::RankStarted{id, 0, 1, 999}, now_);
  (void)ledger_->take(true);
  ASSERT_TRUE(ledger_->rank_records_due());
  now_ += 2min;
  ledger_->tick(now_);
  EXPECT_EQ(ledger_->any_job(id), nullptr);
  Effects after = ledger_->take(true);
  EXPECT_FALSE(ledger_->rank_records_due());
  auto [writes, record] = updates_of(after.changes, id);
  EXPECT_EQ(writes, 1);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, JobState::Completed);
  EXPECT_EQ(record->ranks[1].pid, 999);
}

TEST_F(LedgerTest, AnEndedJobIsKeptAMinuteForLateReportsThenLeftToTheStore) {
  model::JobId id = 0;
  ASSERT_NO_FATAL_FAILURE(completed_two_by_two(id));
  ASSERT_NE(ledger_->any_job(id), nullptr);
  now_ += 59s;
  ledger_->tick(now_);
  commit();
  EXPECT_NE(ledger_->any_job(id), nullptr) << "forgotten before late reports could come";
  now_ += 2s;
  ledger_->tick(now_);
  commit();
  EXPECT_EQ(ledger_->any_job(id), nullptr) << "an ended job stays in memory for good";
  // A report that comes later still changes nothing, and nothing breaks.
  say("a", protocol::RankExited{id, 0, 0, 1, 0, "exited with code 1", false});
  say("a", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::Completed);
  EXPECT_EQ(ledger_->any_job(id), nullptr);
}

TEST_F(LedgerTest, ReportsHeldBackThroughARestartAreAppliedBeforeAnyRankIsJudged) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = running_two_by_two();
  restart();
  // Both agents come back running nothing: all four ranks exited 0 meanwhile.
  ASSERT_TRUE(ledger_->agent_hello("a", hello("a", 2), now_).has_value());
  ASSERT_TRUE(ledger_->agent_hello("b", hello("b", 2), now_).has_value());
  commit();
  EXPECT_EQ(state(id), JobState::Running);  // nothing is judged at hello
  for (int r = 0; r < 2; ++r) say("a", protocol::RankExited{id, 0, r, 0, 0, "", false});
  say("a", protocol::AttemptGone{id, 0});
  say("a", protocol::Synced{});
  EXPECT_EQ(state(id), JobState::Running);  // gpu-b has not synced
  for (int r = 2; r < 4; ++r) say("b", protocol::RankExited{id, 0, r, 0, 0, "", false});
  say("b", protocol::AttemptGone{id, 0});
  say("b", protocol::Synced{});
  EXPECT_EQ(state(id), JobState::Completed);
  EXPECT_EQ((*store_.job(id))->attempt, 0);
}

TEST_F(LedgerTest, ARankItsAgentDoesNotKnowAfterSyncedIsLost) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = running_two_by_two();
  restart();
  rejoin("a", id);
  join("b", hello("b", 2));  // knows nothing of ranks 2 and 3, reported nothing
  EXPECT_EQ(state(id), JobState::Ending);
  EXPECT_EQ((*store_.job(id))->outcome, JobState::NodeFail);
  EXPECT_EQ((*store_.job(id))->ranks[2].state, model::RankState::Lost);
  EXPECT_EQ(sent_to<protocol::Kill>("a").size(), 1u);
}

TEST_F(LedgerTest, ANodeWhoseAgentDisconnectedGetsNoJob) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  ledger_->agent_disconnected("b");
  commit();
  model::JobId id = submit(2, 2);
  EXPECT_EQ(state(id), JobState::Pending);
  EXPECT_TRUE(sent_to<protocol::Prepare>("a").empty());
  EXPECT_EQ(ledger_->scheduler().job(id)->reason.code, sched::PendingCode::NodeDown);
}

TEST_F(LedgerTest, ALostNodesRanksAreFencedAndTheFenceGoesWhenItsAgentConfirms) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId id = running_two_by_two();
  now_ += config_.node_lost_timeout + 1s;
  ledger_->agent_message("a", protocol::Heartbeat{}, now_);
  ledger_->tick(now_);  // b is silent past node_lost_timeout: lost
  commit();
  EXPECT_EQ(state(id), JobState::Ending);
  say("a", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::NodeFail);
  ASSERT_EQ((*store_.job(id))->fences.size(), 1u);
  EXPECT_EQ(ledger_->scheduler().gpu_holder("b", 0), id);
  join("b", hello("b", 2));
  ASSERT_FALSE(sent_to<protocol::Kill>("b").empty());  // asked to confirm after Synced
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_TRUE((*store_.job(id))->fences.empty());
  EXPECT_FALSE(ledger_->scheduler().gpu_holder("b", 0).has_value());
}

// The tick walks its links only when the earliest deadline it saw has come, or a link
// came or came back: each silent node is still lost at the first tick past its own timeout.
TEST_F(LedgerTest, EachSilentNodeIsLostAtTheFirstTickPastItsOwnTimeoutWhateverTheOthersDo) {
  config_.node_lost_timeout = 8s;
  ledger_ = std::make_unique<Ledger>(config_);
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  const Now start = now_;
  const auto step = 250ms;
  auto down = [&](const char* n) { return ledger_->scheduler().node(n)->state == model::NodeState::Down; };
  auto run = [&](Duration from, Duration to, auto beats) {
    std::map<std::string, Now> lost;  // when each went from up to down
    std::map<std::string, bool> was_down{{"a", down("a")}, {"b", down("b")}};
    for (Duration t = from; t <= to; t += step) {
      now_ = start + t;
      if (t % 1s == Duration::zero()) beats(t);
      ledger_->tick(now_);
      commit();
      for (const char* n : {"a", "b"}) {
        if (down(n) && !was_down[n]) lost[n] = now_;
        was_down[n] = down(n);
      }
    }
    return lost;
  };
  // a beats every second; b for 3 s, then no more.
  auto lost = run(Duration::zero(), 20s, [&](Duration t) {
    ledger_->agent_message("a", protocol::Heartbeat{}, now_);
    if (t <= 3s) ledger_->agent_message("b", protocol::Heartbeat{}, now_);
  });
  ASSERT_TRUE(lost.contains("b"));
  EXPECT_EQ(lost["b"], start + 3s + config_.node_lost_timeout + step);
  EXPECT_FALSE(lost.contains("a"));
  // a falls silent too; then b comes back, alone among links that are all lost, and is
  // silent from its hello on.
  lost = run(20s + step, 40s, [&](Duration t) {
    if (t == 30s) join("b", hello("b", 2));
  });
  ASSERT_TRUE(lost.contains("a"));
  EXPECT_EQ(lost["a"], start + 20s + config_.node_lost_timeout + step);
  ASSERT_TRUE(lost.contains("b"));
  EXPECT_EQ(lost["b"], start + 30s + config_.node_lost_timeout + step);
}

// The wall clock steps back an hour (an NTP correction): a node silent from then on is
// still unreachable one node_timeout, and lost one node_lost_timeout, after its last
// heartbeat.
TEST_F(LedgerTest, ANodeFallingSilentAfterTheClockStepsBackIsStillLostOnTime) {
  config_.node_lost_timeout = 8s;
  ledger_ = std::make_unique<Ledger>(config_);
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  ledger_->tick(now_);  // a walk: the next one due a node_timeout from now
  now_.wall -= std::chrono::hours(1);
  const Now last = now_;
  ledger_->agent_message("a", protocol::Heartbeat{}, now_);
  ledger_->agent_message("b", protocol::Heartbeat{}, now_);
  std::optional<Now> unreachable;
  std::optional<Now> lost;
  for (auto t = Duration::zero(); t <= config_.node_lost_timeout + 1s && !lost; t += 250ms) {
    now_ = last + t;
    ledger_->agent_message("a", protocol::Heartbeat{}, now_);
    ledger_->tick(now_);
    commit();
    if (!unreachable && !ledger_->scheduler().reachable("b")) unreachable = now_;
    if (ledger_->scheduler().node("b")->state == model::NodeState::Down) lost = now_;
  }
  ASSERT_TRUE(unreachable.has_value());
  EXPECT_EQ(*unreachable, last + config_.node_timeout + 250ms);
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(*lost, last + config_.node_lost_timeout + 250ms);
  EXPECT_EQ(ledger_->scheduler().node("a")->state, model::NodeState::Up);
}

// The rendezvous deadline, launch.rendezvous_timeout. Both agents stay heard from.
// ---- dependencies

class DependencyTest : public LedgerTest {
 protected:
  // Submits a 2 x 2 job with these dependency lines; returns its id.
  model::JobId dependent(const std::string& lines) { return submit(2, 2, lines); }
  // The running 2 x 2 job's ranks end with `code` on every node, and are confirmed gone.
  void end_running(model::JobId id, int code) {
    for (int r = 0; r < 4; ++r) {
      say(r < 2 ? "a" : "b", protocol::RankExited{id, 0, r, code, 0, "exited with code " + std::to_string(code), false});
    }
    say("a", protocol::AttemptGone{id, 0});
    say("b", protocol::AttemptGone{id, 0});
  }
  std::string reason(model::JobId id) { return (*store_.job(id))->reason; }
  std::string pending_reason(model::JobId id) {
    const auto* j = ledger_->scheduler().job(id);
    return j ? std::string(sched::to_string(j->reason.code)) + ": " + j->reason.detail : "";
  }
  std::optional<Ledger::StoredJob> stored_state(model::JobId id) {
    auto rec = store_.job(id);
    if (!rec || !*rec) return std::nullopt;
    return Ledger::StoredJob{(*rec)->state, (*rec)->array};
  }
};

TEST_F(DependencyTest, AFailureCancelsTheAfterOkChainAndReleasesAfterNotOk) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId a = running_two_by_two();
  model::JobId b = dependent("after_ok: " + std::to_string(a) + "\n");
  model::JobId c = dependent("after_ok: [" + std::to_string(b) + "]\n");
  model::JobId d = dependent("after_not_ok: [" + std::to_string(a) + "]\n");
  EXPECT_EQ(pending_reason(b), "Dependency: waiting for job " + std::to_string(a) + " to complete (after_ok)");
  EXPECT_EQ(pending_reason(d),
            "Dependency: waiting for job " + std::to_string(a) + " to end other than COMPLETED (after_not_ok)");
  end_running(a, 3);
  EXPECT_EQ(state(a), JobState::Failed);
  EXPECT_EQ(state(b), JobState::Cancelled);
  EXPECT_EQ(reason(b), "DependencyNeverSatisfied");
  EXPECT_EQ((*store_.job(b))->detail,
            "job " + std::to_string(a) + " ended FAILED; after_ok needed it to complete");
  EXPECT_EQ(state(c), JobState::Cancelled);  // in turn
  EXPECT_EQ(reason(c), "DependencyNeverSatisfied");
  ledger_->schedule(now_);
  commit();
  EXPECT_EQ(state(d), JobState::Starting);
}

TEST_F(DependencyTest, AJobWaitsForEveryDependencyAndNoneThatDoesNotExist) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId a = running_two_by_two();
  auto spec_text = std::string("name: t\ncommand: \"true\"\nresources: {gpus_per_node: 1}\nafter_any: [999]\n");
  auto spec = model::parse_job_spec(spec_text, "t.yaml");
  ASSERT_TRUE(spec.has_value());
  auto refused = ledger_->submit("alice", *spec, spec_text, now_);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().message(), "after_any: no job 999");
  model::JobId b = submit(1, 1, "after_any: [" + std::to_string(a) + "]\n");
  EXPECT_EQ(state(b), JobState::Pending);
  end_running(a, 3);
  ledger_->schedule(now_);
  commit();
  EXPECT_EQ(state(b), JobState::Starting);  // after_any: any end will do
}

TEST_F(DependencyTest, ARestartKeepsTheWaitAndSettlesOnJobsThatEndedMeanwhileFromTheStore) {
  join("a", hello("a", 2));
  join("b", hello("b", 2));
  model::JobId a = running_two_by_two();
  end_running(a, 0);
  ASSERT_EQ(state(a), JobState::Completed);
  model::JobId x = submit(2, 3);  // no node has 3 GPUs: it waits
  model::JobId ok = dependent("after_ok: [" + std::to_string(a) + ", " + std::to_string(x) + "]\n");
  model::JobId not_ok = dependent("after_not_ok: [" + std::to_string(a) + "]\n");
  EXPECT_EQ(state(not_ok), JobState::Cancelled);  // a completed already
  EXPECT_EQ(pending_reason(ok), "Dependency: waiting for job " + std::to_string(x) + " to complete (after_ok)");
  // After a restart the ledger holds neither a nor the ended jobs: the store tells.
  auto snap = store_.load();
  ASSERT_TRUE(snap.has_value());
  ledger_ = std::make_unique<Ledger>(config_);
  ASSERT_TRUE(ledger_->restore(*snap, now_, [this](model::JobId id) { return stored_state(id); }).has_value());
  commit();
  EXPECT_EQ(pending_reason(ok), "Dependency: waiting for job " + std::to_string(x) + " to complete (after_ok)");
  ASSERT_TRUE(ledger_->cancel(x, "alice", false, now_).has_value());
  commit();
  EXPECT_EQ(state(ok), JobState::Cancelled);
  EXPECT_EQ((*store_.job(ok))->detail, "job " + std::to_string(x) + " ended CANCELLED; after_ok needed it to complete");
}

TEST_F(DependencyTest, AnArrayIsOneCommitOfJobsInARowAndItsLimitHoldsTheRestBack) {
  join("a", hello("a", 4));
  std::string text = "name: sweep\ncommand: \"true\"\nresources: {gpus_per_node: 1}\narray: \"0-9%2\"\n";
  auto s = submit_spec(text);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->ids.size(), 10u);
  EXPECT_EQ(s->ids.back(), s->id + 9);
  ASSERT_TRUE(store_.commit(s->change).has_value());
  ledger_->schedule(now_);
  commit();
  auto running = [&] {
    int n = 0;
    for (auto id : s->ids) n += state(id) == JobState::Starting || state(id) == JobState::Running;
    return n;
  };
  EXPECT_EQ(running(), 2);  // four GPUs free, two allowed
  EXPECT_EQ(pending_reason(s->ids[2]), "JobArrayTaskLimit: array " + std::to_string(s->id) + " runs 2 elements at once");
  EXPECT_EQ((*store_.job(s->ids[4]))->array, (store::ArrayElement{s->id, 4}));
  // One element ends: the next takes its place.
  const model::JobId first = s->ids[0];
  say("a", protocol::PrepareResult{first, 0, true, false, "", "", 29500});
  auto launch = sent_to<protocol::Launch>("a");
  ASSERT_FALSE(launch.empty());
  EXPECT_TRUE(std::find(launch.front().env.begin(), launch.front().env.end(),
                        std::pair<std::string, std::string>{"CORRAL_ARRAY_INDEX", "0"}) != launch.front().env.end());
  ASSERT_TRUE(ledger_->cancel(first, "alice", false, now_).has_value());
  commit();
  say("a", protocol::AttemptGone{first, 0});
  ledger_->schedule(now_);
  commit();
  EXPECT_EQ(state(first), JobState::Cancelled);
  EXPECT_EQ(running(), 2);
  EXPECT_EQ(state(s->ids[2]), JobState::Starting);
  EXPECT_EQ(ledger_->array_elements(s->id).size(), 9u);
}

TEST_F(DependencyTest, AnArraysElementsKeepItsLimitButNotEachACopyOfItsIndices) {
  join("a", hello("a", 4));
  std::string text = "name: sweep\ncommand: \"true\"\nresources: {gpus_per_node: 1}\narray: \"0-9999%3\"\n";
  auto s = submit_spec(text);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->ids.size(), 10000u);
  ASSERT_TRUE(store_.commit(s->change).has_value());
  auto kept = [&](model::JobId id) {
    const auto* job = ledger_->live_job(id);
    EXPECT_NE(job, nullptr);
    EXPECT_TRUE(job && job->spec.array.has_value());
    return job && job->spec.array ? job->spec.array->indices.size() : 1u;
  };
  // 10,000 indices in each of 10,000 elements, twice, held 800 MB.
  EXPECT_EQ(kept(s->ids.front()), 0u);
  EXPECT_EQ(kept(s->ids.back()), 0u);
  ledger_->schedule(now_);
  commit();
  EXPECT_EQ(pending_reason(s->ids[5]), "JobArrayTaskLimit: array " + std::to_string(s->id) + " runs 3 elements at once");
  // Reloaded from the store the same way, and the limit still holds.
  auto snap = store_.load();
  ASSERT_TRUE(snap.has_value());
  ledger_ = std::make_unique<Ledger>(config_);
  ASSERT_TRUE(ledger_->restore(*snap, now_, [this](model::JobId id) { return stored_state(id); }).has_value());
  commit();
  EXPECT_EQ(kept(s->ids.back()), 0u);
  EXPECT_EQ(ledger_->live_job(s->ids.back())->spec.array->max_running, 3);
}

TEST_F(DependencyTest, ADependencyOnAnArraysIdWaitsForEveryElement) {
  join("a", hello("a", 4));
  std::string text = "name: sweep\ncommand: \"true\"\nresources: {gpus_per_node: 1}\narray: \"0-2\"\n";
  auto s = submit_spec(text);
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE(store_.commit(s->change).has_value());
  ledger_->schedule(now_);
  commit();
  model::JobId after = submit(1, 1, "after_ok: " + std::to_string(s->id) + "\n");
  EXPECT_EQ(pending_reason(after),
            "Dependency: waiting for job " + std::to_string(s->id) + " to complete (after_ok) and 2 more");
  // Each element runs and exits: 0, 0, then 1.
  for (int i = 0; i < 3; ++i) {
    const model::JobId e = s->ids[static_cast<std::size_t>(i)];
    int port = 0;
    for (const auto& p : sent_to<protocol::Prepare>("a")) {
      if (p.job == e) port = p.master_port;
    }
    ASSERT_NE(port, 0) << i;
    say("a", protocol::PrepareResult{e, 0, true, false, "", "", port});
    say("a", protocol::RankStarted{e, 0, 0, 100 + i});
    say("a", protocol::RankExited{e, 0, 0, i == 2 ? 1 : 0, 0, "exited", false});
    say("a", protocol::AttemptGone{e, 0});
    if (i < 2) {
      EXPECT_EQ(state(after), JobState::Pending) << i;
    }
  }
  EXPECT_EQ(state(after), JobState::Cancelled);
  EXPECT_EQ((*store_.job(after))->detail,
            "job " + std::to_string(s->ids[2]) + " ended FAILED; after_ok needed it to complete");
}

class RendezvousTest : public LedgerTest {
 protected:
  void pass(Duration d) {
    now_ += d;
    ledger_->agent_message("a", protocol::Heartbeat{}, now_);
    ledger_->agent_message("b", protocol::Heartbeat{}, now_);
    ledger_->tick(now_);
    commit();
  }
  std::vector<std::string> events(model::JobId id) {
    std::vector<std::string> out;
    auto stored = store_.events(id);
    for (const auto& e : stored.value()) out.push_back(e.text);
    return out;
  }
  bool has_event(model::JobId id, const std::string& part) {
    for (const auto& e : events(id)) {
      if (e.find(part) != std::string::npos) return true;
    }
    return false;
  }
  void SetUp() override {
    join("a", hello("a", 2));
    join("b", hello("b", 2));
  }
  static protocol::RankProcess sleeping(int rank) {
    return {rank, true, 812, "python3", "S (sleeping)", "hrtimer_nanosleep", 40, 1};
  }
};

TEST_F(RendezvousTest, EachJoinIsPersistedAndTheLastOneCompletesTheRendezvous) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s}\n");
  pass(1500ms);
  for (int r = 0; r < 3; ++r) say(r < 2 ? "a" : "b", protocol::RankJoined{id, 0, r});
  EXPECT_TRUE((*store_.job(id))->ranks[1].joined_at.has_value());
  EXPECT_FALSE((*store_.job(id))->ranks[3].joined_at.has_value());
  EXPECT_FALSE(has_event(id, "rendezvous complete"));
  say("b", protocol::RankJoined{id, 0, 3});
  say("b", protocol::RankJoined{id, 0, 3});  // twice: the first one counts
  EXPECT_TRUE(has_event(id, "rendezvous complete after 1500 ms: all 4 ranks checked in"))
      << testing::PrintToString(events(id));
  pass(20s);
  EXPECT_EQ(state(id), JobState::Running);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  restart();  // the join times are on disk
  EXPECT_TRUE((*store_.job(id))->ranks[3].joined_at.has_value());
}

TEST_F(RendezvousTest, AtTheDeadlineTheMissingRanksNodeIsAskedAndTheJobFailsNamingIt) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s}\n");
  for (int r = 0; r < 3; ++r) say(r < 2 ? "a" : "b", protocol::RankJoined{id, 0, r});
  pass(9s);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  pass(1s);
  auto asked = sent_to<protocol::Inspect>("b");
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], (protocol::Inspect{id, 0, {3}}));
  EXPECT_TRUE(sent_to<protocol::Inspect>("a").empty()) << "a's ranks all checked in";
  EXPECT_EQ(state(id), JobState::Running) << "judged once the answer came";
  say("b", protocol::Inspection{id, 0, {sleeping(3)}});
  EXPECT_EQ(state(id), JobState::Ending);
  auto rec = *store_.job(id);
  EXPECT_EQ(rec->outcome, JobState::Failed);
  EXPECT_EQ(rec->reason, "RendezvousTimeout");
  EXPECT_TRUE(has_event(id, "rendezvous not complete after 10s: 3 of 4 ranks checked in; missing rank 3 on b: alive, "
                            "pid 812 (python3) S (sleeping) in hrtimer_nanosleep, 0.04 s of CPU since it started"))
      << testing::PrintToString(events(id));
  EXPECT_FALSE(sent_to<protocol::Kill>("a").empty());  // the gang goes down
}

TEST_F(RendezvousTest, ANodeThatDoesNotAnswerWithinTwoSecondsIsNamedAsSuch) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s}\n");
  say("a", protocol::RankJoined{id, 0, 0});
  pass(10s);
  ASSERT_EQ(sent_to<protocol::Inspect>("a").size(), 1u);
  ASSERT_EQ(sent_to<protocol::Inspect>("b").size(), 1u);
  say("a", protocol::Inspection{id, 0, {sleeping(1)}});
  EXPECT_EQ(state(id), JobState::Running);
  pass(1999ms);
  EXPECT_EQ(state(id), JobState::Running);
  pass(1ms);
  EXPECT_EQ((*store_.job(id))->reason, "RendezvousTimeout");
  EXPECT_TRUE(has_event(id, "1 of 4 ranks checked in; missing rank 1 on a: alive, pid 812"));
  EXPECT_TRUE(has_event(id, "rank 2 on b: its agent did not answer; rank 3 on b: its agent did not answer"));
}

TEST_F(RendezvousTest, ADeadlineWhileAMissingRanksAgentIsAwayWaitsForItsReturn) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 3s}\n");
  for (int r = 0; r < 3; ++r) say(r < 2 ? "a" : "b", protocol::RankJoined{id, 0, r});
  ledger_->agent_disconnected("b");
  commit();
  pass(3s);  // within node_timeout (and node_lost_timeout): b is away, not lost
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  EXPECT_EQ(state(id), JobState::Running) << "b's outbox may hold rank 3's check-in";
  auto hb = hello("b", 2);
  hb.running = {{id, 0, 2, 102}, {id, 0, 3, 103}};
  ASSERT_TRUE(ledger_->agent_hello("b", hb, now_).has_value());
  commit();
  say("b", protocol::RankJoined{id, 0, 3});  // held back while away
  say("b", protocol::Synced{});
  pass(100ms);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  EXPECT_TRUE(has_event(id, "rendezvous complete"));
  EXPECT_EQ(state(id), JobState::Running);
}

TEST_F(RendezvousTest, ARestartedCoordinatorDoesNotJudgeADeadlineThatPassedBeforeIt) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s}\n");
  say("a", protocol::RankJoined{id, 0, 0});
  now_ += 11s;  // the coordinator was down across the deadline
  restart();
  rejoin("a", id);
  rejoin("b", id);
  pass(1s);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  EXPECT_EQ(state(id), JobState::Running);
}

TEST_F(RendezvousTest, WarnLeavesTheJobRunningWithTheMessageAsAnEvent) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s, on_rendezvous_timeout: warn}\n");
  for (int r = 0; r < 3; ++r) say(r < 2 ? "a" : "b", protocol::RankJoined{id, 0, r});
  pass(10s);
  protocol::RankProcess gone{3, false, 0, "", "", "", 0, 0};
  say("b", protocol::Inspection{id, 0, {gone}});
  EXPECT_EQ(state(id), JobState::Running);
  EXPECT_TRUE(has_event(id, "missing rank 3 on b: no process left"));
  pass(60s);
  EXPECT_EQ(sent_to<protocol::Inspect>("b").size(), 1u) << "warned once";
}

TEST_F(RendezvousTest, AJobWhereNoRankEverCheckedInIsNotJudgedByARendezvousItDoesNotUse) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s}\n");
  pass(10s);
  EXPECT_EQ(state(id), JobState::Running);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  EXPECT_TRUE(has_event(id, "the rendezvous deadline is not applied"));
}

TEST_F(RendezvousTest, ZeroTurnsTheDeadlineOffAndNcclModeIsNotWatchedThisWay) {
  model::JobId off = running_two_by_two("launch: {rendezvous_timeout: 0}\n");
  say("a", protocol::RankJoined{off, 0, 0});
  pass(10min);
  EXPECT_EQ(state(off), JobState::Running);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
}

TEST_F(RendezvousTest, ARankThatEndedBeforeItWasSeenIsNotMissingAndAStaleAnswerIsIgnored) {
  model::JobId id = running_two_by_two("launch: {rendezvous_timeout: 10s}\n");
  for (int r = 0; r < 3; ++r) say(r < 2 ? "a" : "b", protocol::RankJoined{id, 0, r});
  say("b", protocol::Inspection{id, 0, {sleeping(3)}});  // not asked: ignored
  EXPECT_EQ(state(id), JobState::Running);
  say("b", protocol::RankExited{id, 0, 3, 0, 0, "exited with code 0", false});
  pass(10s);
  EXPECT_TRUE(sent_to<protocol::Inspect>("b").empty());
  EXPECT_EQ(state(id), JobState::Running);
}

TEST_F(RendezvousTest, AHangIsReportedOnceEveryRankStoppedNamingTheFirstToStop) {
  model::JobId id = running_two_by_two("launch: {hang_timeout: 5m}\n");
  EXPECT_EQ(sent_to<protocol::Launch>("b")[0].hang_timeout_ms, 300000);
  pass(20min);
  // Rank 3 stopped first (7 min ago); the others 5 min ago, waiting for it.
  say("b", protocol::RankStall{id, 0, 3, true, 420000, "T (stopped)"});
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(has_event(id, "hang:")) << "rank " << r << " still moves";
    say(r < 2 ? "a" : "b", protocol::RankStall{id, 0, r, true, 300000, "S (sleeping)"});
  }
  auto all = events(id);
  ASSERT_TRUE(has_event(
      id,
      "hang: no rank has used CPU or its GPUs for 5m (launch.hang_timeout); stopped first: rank 3 on b "
      "(T (stopped), since "))
      << testing::PrintToString(all);
  EXPECT_TRUE(has_event(id, "; then rank 0 on a (S (sleeping), since "));
  EXPECT_TRUE(has_event(id, "corral stack " + std::to_string(id) + " shows where each rank is"));
  auto rec = *store_.job(id);
  ASSERT_EQ(rec->ranks[3].warnings.size(), 1u);
  EXPECT_TRUE(rec->ranks[3].warnings[0].starts_with("stopped first in the hang found at "));
  EXPECT_TRUE(rec->ranks[0].warnings.empty());
  EXPECT_EQ(state(id), JobState::Running) << "a hang is reported, not acted on";
  // Reported once; progress again is an event, and a new hang is reported anew.
  say("a", protocol::RankStall{id, 0, 0, true, 301000, "S (sleeping)"});
  EXPECT_EQ(events(id).size(), all.size());
  say("a", protocol::RankStall{id, 0, 1, false, 0, "R (running)"});
  EXPECT_TRUE(has_event(id, "rank 1 on a makes progress again"));
  restart();  // the warning is on disk
  EXPECT_EQ((*store_.job(id))->ranks[3].warnings.size(), 1u);
}

TEST_F(RendezvousTest, NoHangWhileOneRankStillMovesOrHasEnded) {
  model::JobId id = running_two_by_two("launch: {hang_timeout: 5m}\n");
  for (int r = 0; r < 3; ++r) say(r < 2 ? "a" : "b", protocol::RankStall{id, 0, r, true, 300000, "S (sleeping)"});
  EXPECT_FALSE(has_event(id, "hang:"));
  // Rank 3 ends with 0 (its part done); the three left are all stopped: that is a hang,
  // found when rank 3's exit comes.
  say("b", protocol::RankExited{id, 0, 3, 0, 0, "exited with code 0", false});
  EXPECT_TRUE(has_event(id, "hang:"));
  // A report for another attempt or node is not this job's.
  say("b", protocol::RankStall{id, 5, 0, true, 300000, "S (sleeping)"});
  say("a", protocol::RankStall{id, 0, 2, true, 300000, "S (sleeping)"});
}

// ---- silence: unreachable at node_timeout, lost only at node_lost_timeout

class SilenceTest : public LedgerTest {
 protected:
  void SetUp() override {
    join("a", hello("a", 2));
    join("b", hello("b", 2));
  }
  // Time passes by seconds; a beats, b says nothing.
  void only_a_beats(Duration d) { beats(d, {"a"}); }
  // b's link closed (as the service does once the ledger asks it) and b said nothing for d.
  void b_silent_for(Duration d) {
    only_a_beats(config_.node_timeout + 1s);
    ASSERT_NE(std::find(closed_.begin(), closed_.end(), "b"), closed_.end()) << "b's silent link is closed";
    ledger_->agent_disconnected("b");
    commit();
    only_a_beats(d - (config_.node_timeout + 1s));
  }
  // b dials again, listing the ranks it runs, and syncs.
  void b_back(std::vector<protocol::RunningRank> running) {
    auto hb = hello("b", 2);
    hb.running = std::move(running);
    join("b", hb);
  }
  int count_events(model::JobId id, const std::string& part) {
    int n = 0;
    auto stored = store_.events(id);
    for (const auto& e : stored.value()) n += e.text.find(part) != std::string::npos;
    return n;
  }
};

TEST_F(SilenceTest, ASilentNodeTakesNoNewJobAtNodeTimeoutButIsNotLost) {
  only_a_beats(config_.node_timeout + 1s);
  EXPECT_FALSE(ledger_->scheduler().reachable("b"));
  EXPECT_EQ(ledger_->scheduler().node("b")->state, model::NodeState::Up);
  ASSERT_TRUE(ledger_->lost_at("b").has_value());
  EXPECT_EQ(*ledger_->lost_at("b"), now_.mono - (config_.node_timeout + 1s) + config_.node_lost_timeout);
  EXPECT_FALSE(ledger_->lost_at("a").has_value());
  model::JobId id = submit(2, 2);
  EXPECT_EQ(state(id), JobState::Pending);
  EXPECT_TRUE(sent_to<protocol::Prepare>("a").empty());
  EXPECT_EQ(ledger_->scheduler().job(id)->reason.code, sched::PendingCode::NodeDown);
}

TEST_F(SilenceTest, AJobOnANodeSilentLessThanNodeLostTimeoutRunsOnAndCompletesWhenItsAgentIsBack) {
  model::JobId id = running_two_by_two();
  b_silent_for(2min);
  EXPECT_EQ(state(id), JobState::Running);
  EXPECT_EQ(count_events(id, "node b is silent (no heartbeat, nothing heard for 6s)"), 1)
      << "told once, not every tick";
  EXPECT_TRUE(sent_to<protocol::Kill>("a").empty());
  EXPECT_EQ((*store_.job(id))->ranks[2].state, model::RankState::Running);
  // b is back: its ranks ran on, and carry on.
  b_back({{id, 0, 2, 102}, {id, 0, 3, 103}});
  EXPECT_EQ(state(id), JobState::Running);
  EXPECT_TRUE(ledger_->scheduler().reachable("b"));
  EXPECT_EQ(count_events(id, "node b is back after 2m of silence"), 1);
  EXPECT_TRUE(sent_to<protocol::Kill>("a").empty());
  EXPECT_TRUE(sent_to<protocol::Kill>("b").empty());
  EXPECT_EQ(sent_to<protocol::Launch>("b").size(), 1u) << "its ranks are not started again";
  for (int r = 0; r < 4; ++r) say(r < 2 ? "a" : "b", protocol::RankExited{id, 0, r, 0, 0, "", false});
  say("a", protocol::AttemptGone{id, 0});
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::Completed);
  // A later silence is told anew.
  sent_.clear();
  model::JobId next = running_two_by_two();
  b_silent_for(config_.node_timeout + 2s);
  EXPECT_EQ(count_events(next, "node b is silent"), 1);
}

TEST_F(SilenceTest, ANodeSilentPastNodeLostTimeoutIsLostWithItsJob) {
  model::JobId id = running_two_by_two();
  b_silent_for(config_.node_lost_timeout);
  EXPECT_EQ(state(id), JobState::Running) << "not a second before node_lost_timeout";
  only_a_beats(1s);
  EXPECT_EQ(ledger_->scheduler().node("b")->state, model::NodeState::Down);
  EXPECT_EQ(ledger_->scheduler().node("b")->reason, "no heartbeat for 5m1s");
  EXPECT_EQ(state(id), JobState::Ending);
  EXPECT_EQ((*store_.job(id))->outcome, JobState::NodeFail);
  ASSERT_EQ(sent_to<protocol::Kill>("a").size(), 1u);
  say("a", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::NodeFail);
  ASSERT_EQ((*store_.job(id))->fences.size(), 1u) << "b's ranks are not confirmed dead";
  EXPECT_EQ(ledger_->scheduler().gpu_holder("b", 0), id);
  // Its agent, back late, is asked to kill them; the fence goes once it confirms.
  b_back({{id, 0, 2, 102}, {id, 0, 3, 103}});
  ASSERT_FALSE(sent_to<protocol::Kill>("b").empty());
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_TRUE((*store_.job(id))->fences.empty());
  EXPECT_FALSE(ledger_->scheduler().gpu_holder("b", 0).has_value());
}

// A coordinator restart is no reason to lose a node sooner: an agent not back when the
// reconnect grace ends is silent since the restart, and lost only node_lost_timeout after it.
TEST_F(SilenceTest, AnAgentNotBackWhenTheReconnectGraceEndsIsSilentNotLostAndCarriesOnWhenBack) {
  model::JobId id = running_two_by_two();
  now_ += 1s;
  restart();
  rejoin("a", id);
  ASSERT_TRUE(ledger_->in_grace());
  ASSERT_TRUE(ledger_->lost_at("b").has_value());
  EXPECT_EQ(*ledger_->lost_at("b"), now_.mono + config_.node_lost_timeout);
  only_a_beats(config_.reconnect_grace + 1s);
  EXPECT_FALSE(ledger_->in_grace());
  EXPECT_EQ(ledger_->scheduler().node("b")->state, model::NodeState::Up);
  EXPECT_FALSE(ledger_->scheduler().reachable("b"));
  EXPECT_EQ(state(id), JobState::Running);
  EXPECT_EQ(count_events(id, "node b is silent"), 1);
  only_a_beats(2min);
  EXPECT_EQ(state(id), JobState::Running);
  b_back({{id, 0, 2, 102}, {id, 0, 3, 103}});
  EXPECT_TRUE(ledger_->scheduler().reachable("b"));
  for (int r = 0; r < 4; ++r) say(r < 2 ? "a" : "b", protocol::RankExited{id, 0, r, 0, 0, "", false});
  say("a", protocol::AttemptGone{id, 0});
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::Completed);
}

TEST_F(SilenceTest, AnAgentNotBackNodeLostTimeoutAfterARestartIsLostWithItsJob) {
  model::JobId id = running_two_by_two();
  restart();
  rejoin("a", id);
  only_a_beats(config_.node_lost_timeout);
  EXPECT_EQ(state(id), JobState::Running) << "not a second before node_lost_timeout";
  only_a_beats(1s);
  EXPECT_EQ(ledger_->scheduler().node("b")->state, model::NodeState::Down);
  EXPECT_EQ(state(id), JobState::Ending);
  EXPECT_EQ((*store_.job(id))->outcome, JobState::NodeFail);
}

TEST_F(SilenceTest, ARankFailingElsewhereEndsTheJobAtOnceAndTheSilentNodeHoldsItsGpusUntilItConfirms) {
  model::JobId id = running_two_by_two();
  b_silent_for(30s);
  say("a", protocol::RankExited{id, 0, 1, 1, 0, "exited with code 1", false});
  EXPECT_EQ(state(id), JobState::Ending);
  EXPECT_EQ((*store_.job(id))->outcome, JobState::Failed);
  ASSERT_EQ(sent_to<protocol::Kill>("a").size(), 1u);
  say("a", protocol::RankExited{id, 0, 0, -1, 15, "killed by SIGTERM", false});
  say("a", protocol::AttemptGone{id, 0});
  EXPECT_FALSE(ledger_->scheduler().gpu_holder("a", 0).has_value()) << "a confirmed: its GPUs serve others";
  only_a_beats(1min);
  EXPECT_EQ(state(id), JobState::Ending) << "b's ranks may still run";
  EXPECT_EQ(ledger_->scheduler().gpu_holder("b", 0), id);
  EXPECT_EQ(ledger_->scheduler().gpu_holder("b", 1), id);
  EXPECT_TRUE((*store_.job(id))->fences.empty());
  // b is back with its ranks: told to kill them; the job ends once it confirms.
  const auto kills = sent_to<protocol::Kill>("b").size();
  b_back({{id, 0, 2, 102}, {id, 0, 3, 103}});
  ASSERT_GT(sent_to<protocol::Kill>("b").size(), kills);
  EXPECT_EQ(state(id), JobState::Ending);
  say("b", protocol::RankExited{id, 0, 2, -1, 15, "killed by SIGTERM", false});
  say("b", protocol::RankExited{id, 0, 3, -1, 15, "killed by SIGTERM", false});
  say("b", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::Failed);
  EXPECT_EQ((*store_.job(id))->failed_rank, 1);
  EXPECT_FALSE(ledger_->scheduler().gpu_holder("b", 0).has_value());
  EXPECT_TRUE((*store_.job(id))->fences.empty());
}

TEST_F(SilenceTest, ARankFailingElsewhereWhileANodeStaysSilentFencesItsGpusOnceItIsLost) {
  model::JobId id = running_two_by_two();
  b_silent_for(30s);
  say("a", protocol::RankExited{id, 0, 1, 1, 0, "exited with code 1", false});
  say("a", protocol::RankExited{id, 0, 0, -1, 15, "killed by SIGTERM", false});
  say("a", protocol::AttemptGone{id, 0});
  EXPECT_EQ(state(id), JobState::Ending);
  only_a_beats(config_.node_lost_timeout - 30s + 1s);
  EXPECT_EQ(ledger_->scheduler().node("b")->state, model::NodeState::Down);
  EXPECT_EQ(state(id), JobState::Failed) << "the outcome decided at the failure stays";
  ASSERT_EQ((*store_.job(id))->fences.size(), 1u);
  EXPECT_EQ((*store_.job(id))->fences[0].node, "b");
  EXPECT_EQ(ledger_->scheduler().gpu_holder("b", 0), id);
}

// ---- clock steps: the wall clock dates, the monotonic clock times

class ClockStepTest : public SilenceTest, public ::testing::WithParamInterface<Duration> {
 protected:
  // Time passes by seconds; both agents beat, the coordinator ticks and runs its passes.
  void both_beat(Duration d) { beats(d, {"a", "b"}, /*passes=*/true); }
};

// Forward or back, by seconds or an hour: no node is found silent, the job's time limit
// ends it 30 minutes after it started, not earlier and not later, and what happens is
// dated by the wall clock as it reads after the step.
TEST_P(ClockStepTest, AWallClockStepMovesNoDeadline) {
  model::JobId id = running_two_by_two("time_limit: 30m\n");
  both_beat(10s);
  now_.wall += GetParam();
  both_beat(3s);
  EXPECT_TRUE(ledger_->scheduler().reachable("a"));
  EXPECT_TRUE(ledger_->scheduler().reachable("b"));
  EXPECT_TRUE(closed_.empty());
  EXPECT_EQ(state(id), JobState::Running);
  both_beat(30min - 14s);  // a second before the limit
  EXPECT_EQ(state(id), JobState::Running);
  both_beat(1s);
  auto rec = *store_.job(id);
  EXPECT_EQ(rec->state, JobState::Ending);
  EXPECT_EQ(rec->reason, "TimeLimit");
  auto events = store_.events(id).value();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().at, now_.wall);
  // Its ranks killed: it ends TIMEOUT, and never before it started, whichever way the
  // clock went (an hour back, the agents' dates are ahead of ours).
  for (int r = 0; r < 4; ++r) {
    protocol::RankExited m{id, 0, r, -1, 15, "killed by signal 15", false};
    m.ended_at_ms = to_millis(now_.wall - GetParam());
    say(r < 2 ? "a" : "b", m);
  }
  say("a", protocol::AttemptGone{id, 0});
  say("b", protocol::AttemptGone{id, 0});
  rec = *store_.job(id);
  EXPECT_EQ(rec->state, JobState::Timeout);
  ASSERT_TRUE(rec->started_at && rec->ended_at);
  EXPECT_GE(*rec->ended_at, *rec->started_at);
  for (const auto& r : rec->ranks) EXPECT_GE(*r.ended_at, *rec->started_at);
}

INSTANTIATE_TEST_SUITE_P(Steps, ClockStepTest, ::testing::Values(Duration(1h), Duration(-1h), Duration(10s)));

// A silent node is still found silent at node_timeout and lost at node_lost_timeout
// after its last heartbeat, however the wall clock stepped in between.
TEST_P(ClockStepTest, ASilentNodeIsLostOnTimeAcrossAStep) {
  model::JobId id = running_two_by_two();
  const Instant last = now_.mono;
  std::optional<Instant> unreachable;
  std::optional<Instant> lost;
  for (Duration t = Duration::zero(); t < config_.node_lost_timeout + 2s; t += 1s) {
    now_ += 1s;
    if (t == 2s) now_.wall += GetParam();
    ledger_->agent_message("a", protocol::Heartbeat{}, now_);
    ledger_->tick(now_);
    commit();
    if (!unreachable && !ledger_->scheduler().reachable("b")) unreachable = now_.mono;
    if (!lost && ledger_->scheduler().node("b")->state == model::NodeState::Down) lost = now_.mono;
  }
  ASSERT_TRUE(unreachable.has_value());
  EXPECT_EQ(*unreachable - last, config_.node_timeout + 1s);
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(*lost - last, config_.node_lost_timeout + 1s);
  EXPECT_EQ(state(id), JobState::Ending);
}

// The monotonic clock starts over with each coordinator process: a running job's time
// limit then counts from its start as the wall clock dated it.
TEST_F(ClockStepTest, AfterARestartATimeLimitCountsFromTheStartTheWallClockDated) {
  model::JobId id = running_two_by_two("time_limit: 30m\n");
  both_beat(10min);
  now_.mono = instant_from_millis(42);  // a new process (or a new boot)
  restart();
  rejoin("a", id);
  rejoin("b", id);
  both_beat(20min - 1s);
  EXPECT_EQ(state(id), JobState::Running);
  both_beat(1s);
  EXPECT_EQ(state(id), JobState::Ending);
}

}  // namespace
}  // namespace corral::ledger
