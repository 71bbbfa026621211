#pragma once
// The one job state machine: every state change of a job goes through next_state().

#include <optional>
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
  NodeLost,          // a node it runs on went down, or its agent does not know a rank
  RanksGone,         // every agent confirmed that no process of the attempt is left
  RendezvousTimeout,  // not every rank checked in by launch.rendezvous_timeout
  DependencyNeverSatisfied,  // a job it waits for ended in a way that can never let it start
};
inline constexpr JobEvent kAllJobEvents[] = {
    JobEvent::Schedule, JobEvent::AllRanksStarted, JobEvent::AllRanksExitedOk,
    JobEvent::RankFailed, JobEvent::LaunchFailed, JobEvent::PortBusy,
    JobEvent::Cancel, JobEvent::TimeLimit, JobEvent::NodeLost, JobEvent::RanksGone,
    JobEvent::RendezvousTimeout, JobEvent::DependencyNeverSatisfied};

std::string_view to_string(JobEvent event);

struct Transition {
  model::JobState to;
  bool new_attempt = false;  // requeued: PENDING again with attempt + 1
  // to == ENDING: the state the job takes once every rank is confirmed gone (a terminal
  // state, or PENDING for a requeue).
  std::optional<model::JobState> outcome = std::nullopt;
};

// The state a job in `from` moves to on `event`. An attempt that started launching never
// ends directly: it goes to ENDING with its outcome, and RanksGone takes it there (only
// PortBusy, which answers PREPARE before any rank is launched, goes back to PENDING at
// once). `retry_left` says whether the job has retries left (RankFailed and NodeLost then
// requeue); `outcome` is the ENDING job's recorded outcome. Conflict for events that do
// not apply in `from` (anything on a terminal job; on an ENDING job, all but RanksGone:
// its outcome is decided).
Result<Transition> next_state(model::JobState from, JobEvent event, bool retry_left,
                              std::optional<model::JobState> outcome = std::nullopt);

}  // namespace corral::sched
