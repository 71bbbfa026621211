#include "coordinator/sched/state_machine.hpp"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

namespace corral::sched {
namespace {

using model::JobState;
using S = JobState;
using E = JobEvent;

// The whole table: (state, event) -> (next without retries, next with retries), each as
// (state, outcome). Absent pairs must be refused. An attempt that launched only ends
// through ENDING, which keeps its GPUs until RanksGone.
struct Step {
  S to;
  std::optional<S> outcome;
};
struct Expected {
  Step no_retry;
  Step with_retry;
};

const std::map<std::pair<S, E>, Expected>& table() {
  static const std::map<std::pair<S, E>, Expected> t = {
      {{S::Pending, E::Schedule}, {{S::Starting, {}}, {S::Starting, {}}}},
      {{S::Pending, E::Cancel}, {{S::Cancelled, {}}, {S::Cancelled, {}}}},
      {{S::Starting, E::AllRanksStarted}, {{S::Running, {}}, {S::Running, {}}}},
      {{S::Starting, E::AllRanksExitedOk}, {{S::Ending, S::Completed}, {S::Ending, S::Completed}}},
      {{S::Starting, E::RankFailed}, {{S::Ending, S::Failed}, {S::Ending, S::Pending}}},
      {{S::Starting, E::LaunchFailed}, {{S::Ending, S::Failed}, {S::Ending, S::Failed}}},
      {{S::Starting, E::PortBusy}, {{S::Pending, {}}, {S::Pending, {}}}},
      {{S::Starting, E::Cancel}, {{S::Ending, S::Cancelled}, {S::Ending, S::Cancelled}}},
      {{S::Starting, E::TimeLimit}, {{S::Ending, S::Timeout}, {S::Ending, S::Timeout}}},
      {{S::Starting, E::NodeLost}, {{S::Ending, S::NodeFail}, {S::Ending, S::Pending}}},
      {{S::Running, E::AllRanksExitedOk}, {{S::Ending, S::Completed}, {S::Ending, S::Completed}}},
      {{S::Running, E::RankFailed}, {{S::Ending, S::Failed}, {S::Ending, S::Pending}}},
      {{S::Running, E::Cancel}, {{S::Ending, S::Cancelled}, {S::Ending, S::Cancelled}}},
      {{S::Running, E::TimeLimit}, {{S::Ending, S::Timeout}, {S::Ending, S::Timeout}}},
      {{S::Running, E::NodeLost}, {{S::Ending, S::NodeFail}, {S::Ending, S::Pending}}},
      {{S::Starting, E::RendezvousTimeout}, {{S::Ending, S::Failed}, {S::Ending, S::Pending}}},
      {{S::Running, E::RendezvousTimeout}, {{S::Ending, S::Failed}, {S::Ending, S::Pending}}},
      {{S::Pending, E::DependencyNeverSatisfied}, {{S::Cancelled, std::nullopt}, {S::Cancelled, std::nullopt}}},
  };
  return t;
}

TEST(JobStateMachine, EveryStateEventPairFollowsTheTable) {
  int checked = 0;
  for (S s : model::kAllJobStates) {
    if (s == S::Ending) continue;  // its own test below: it depends on the outcome
    for (E e : kAllJobEvents) {
      for (bool retry : {false, true}) {
        auto got = next_state(s, e, retry);
        auto it = table().find({s, e});
        SCOPED_TRACE(std::string(model::to_string(s)) + " + " + std::string(to_string(e)) +
                     (retry ? " (retries left)" : ""));
        if (it == table().end()) {
          ASSERT_FALSE(got.has_value());
          EXPECT_EQ(got.error().code(), ErrorCode::Conflict);
        } else {
          ASSERT_TRUE(got.has_value());
          const Step& want = retry ? it->second.with_retry : it->second.no_retry;
          EXPECT_EQ(got->to, want.to);
          EXPECT_EQ(got->outcome, want.outcome);
          EXPECT_FALSE(got->new_attempt);  // only leaving ENDING for PENDING starts a new attempt
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 8 * 12 * 2);
}

TEST(JobStateMachine, EndingTakesItsOutcomeOnlyWhenEveryRankIsGone) {
  for (S outcome : {S::Completed, S::Failed, S::Cancelled, S::Timeout, S::NodeFail, S::Pending}) {
    SCOPED_TRACE(std::string(model::to_string(outcome)));
    for (E e : kAllJobEvents) {
      auto got = next_state(S::Ending, e, true, outcome);
      if (e != E::RanksGone) {
        ASSERT_FALSE(got.has_value());
        EXPECT_EQ(got.error().code(), ErrorCode::Conflict);
        continue;
      }
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(got->to, outcome);
      EXPECT_EQ(got->new_attempt, outcome == S::Pending);
    }
  }
}

TEST(JobStateMachine, EndingWithoutAnOutcomeIsRefused) {
  EXPECT_FALSE(next_state(S::Ending, E::RanksGone, false).has_value());
  EXPECT_FALSE(next_state(S::Ending, E::RanksGone, false, S::Running).has_value());
  EXPECT_FALSE(next_state(S::Ending, E::RanksGone, false, S::Ending).has_value());
}

TEST(JobStateMachine, TerminalStatesAcceptNoEvent) {
  for (S s : model::kAllJobStates) {
    if (!model::is_terminal(s)) continue;
    for (E e : kAllJobEvents) EXPECT_FALSE(next_state(s, e, true).has_value());
  }
}

TEST(JobStateMachine, RefusalNamesTheEventAndState) {
  auto r = next_state(S::Completed, E::Cancel, false);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "event Cancel does not apply to a COMPLETED job");
}

TEST(JobStateMachine, PortBusyPlacesTheSameAttemptAgain) {
  auto r = next_state(S::Starting, E::PortBusy, false);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->to, S::Pending);
  EXPECT_FALSE(r->new_attempt);
}

}  // namespace
}  // namespace corral::sched
