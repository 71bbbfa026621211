#pragma once
// The one job state machine: every state change of a job goes through next_state().

#include <string_view>

#include "common/core/error.hpp"
#include "common/model/job.hpp"

namespace corral::sched {

enum class JobEvent {
  Schedule,          // the scheduler placed the job
  AllRanksStarted,   // every agent reported every rank started
  AllRanksExitedOk,  // every rank exited 0
  RankFailed,        // a rank exited non-zero or was killed by a signal
  LaunchFailed,      // an agent could not start a rank (no such user, bad workdir, ...)
  PortBusy,          // the rank-0 agent found the master port taken: place again
  Cancel,            // a person cancelled it
  TimeLimit,         // it ran past its time limit
  NodeLost,          // a node it runs on went down
};
inline constexpr JobEvent kAllJobEvents[] = {
    JobEvent::Schedule, JobEvent::AllRanksStarted, JobEvent::AllRanksExitedOk,
    JobEvent::RankFailed, JobEvent::LaunchFailed, JobEvent::PortBusy,
    JobEvent::Cancel, JobEvent::TimeLimit, JobEvent::NodeLost};

std::string_view to_string(JobEvent event);

struct Transition {
  model::JobState to;
  bool new_attempt = false;  // requeued: PENDING again with attempt + 1
};

// The state a job in `from` moves to on `event`. `retry_left` says whether the job has
// retries left (RankFailed and NodeLost then requeue). Conflict for events that do not
// apply in `from` (e.g. anything on a terminal job).
Result<Transition> next_state(model::JobState from, JobEvent event, bool retry_left);

}  // namespace corral::sched
