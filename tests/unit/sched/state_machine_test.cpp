#include "coordinator/sched/state_machine.hpp"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

namespace corral::sched {
namespace {

using model::JobState;
using S = JobState;
using E = JobEvent;

// The whole table: (state, event) -> (next without retries, next with retries). Absent
// pairs must be refused.
struct Expected {
  S no_retry;
  S with_retry;
};

const std::map<std::pair<S, E>, Expected>& table() {
  static const std::map<std::pair<S, E>, Expected> t = {
      {{S::Pending, E::Schedule}, {S::Starting, S::Starting}},
      {{S::Pending, E::Cancel}, {S::Cancelled, S::Cancelled}},
      {{S::Starting, E::AllRanksStarted}, {S::Running, S::Running}},
      {{S::Starting, E::AllRanksExitedOk}, {S::Completed, S::Completed}},
      {{S::Starting, E::RankFailed}, {S::Failed, S::Pending}},
      {{S::Starting, E::LaunchFailed}, {S::Failed, S::Failed}},
      {{S::Starting, E::PortBusy}, {S::Pending, S::Pending}},
      {{S::Starting, E::Cancel}, {S::Cancelled, S::Cancelled}},
      {{S::Starting, E::TimeLimit}, {S::Timeout, S::Timeout}},
      {{S::Starting, E::NodeLost}, {S::NodeFail, S::Pending}},
      {{S::Running, E::AllRanksExitedOk}, {S::Completed, S::Completed}},
      {{S::Running, E::RankFailed}, {S::Failed, S::Pending}},
      {{S::Running, E::Cancel}, {S::Cancelled, S::Cancelled}},
      {{S::Running, E::TimeLimit}, {S::Timeout, S::Timeout}},
      {{S::Running, E::NodeLost}, {S::NodeFail, S::Pending}},
  };
  return t;
}

TEST(JobStateMachine, EveryStateEventPairFollowsTheTable) {
  int checked = 0;
  for (S s : model::kAllJobStates) {
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
          EXPECT_EQ(got->to, retry ? it->second.with_retry : it->second.no_retry);
          bool requeued = got->to == S::Pending && s != S::Pending && e != E::PortBusy;
          EXPECT_EQ(got->new_attempt, requeued);
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 8 * 9 * 2);
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
