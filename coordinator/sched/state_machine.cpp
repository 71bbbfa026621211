#include "coordinator/sched/state_machine.hpp"

#include <string>

namespace corral::sched {

using model::JobState;

std::string_view to_string(JobEvent event) {
  switch (event) {
    case JobEvent::Schedule: return "Schedule";
    case JobEvent::AllRanksStarted: return "AllRanksStarted";
    case JobEvent::AllRanksExitedOk: return "AllRanksExitedOk";
    case JobEvent::RankFailed: return "RankFailed";
    case JobEvent::LaunchFailed: return "LaunchFailed";
    case JobEvent::PortBusy: return "PortBusy";
    case JobEvent::Cancel: return "Cancel";
    case JobEvent::TimeLimit: return "TimeLimit";
    case JobEvent::NodeLost: return "NodeLost";
    case JobEvent::RanksGone: return "RanksGone";
    case JobEvent::RendezvousTimeout: return "RendezvousTimeout";
    case JobEvent::DependencyNeverSatisfied: return "DependencyNeverSatisfied";
  }
  return "Unknown";
}

namespace {

Result<Transition> invalid(JobState from, JobEvent event) {
  return make_error(ErrorCode::Conflict, std::string("event ") + std::string(to_string(event)) +
                                             " does not apply to a " + std::string(model::to_string(from)) +
                                             " job");
}

// The attempt is over with `outcome`; its ranks still have to be confirmed gone.
Transition ending(JobState outcome) { return {JobState::Ending, false, outcome}; }

Transition failed_or_requeued(JobState failure, bool retry_left) {
  return ending(retry_left ? JobState::Pending : failure);
}

}  // namespace

Result<Transition> next_state(JobState from, JobEvent event, bool retry_left, std::optional<JobState> outcome) {
  switch (from) {
    case JobState::Pending:
      switch (event) {
        case JobEvent::Schedule: return Transition{JobState::Starting};
        case JobEvent::Cancel: return Transition{JobState::Cancelled};
        case JobEvent::DependencyNeverSatisfied: return Transition{JobState::Cancelled};
        default: return invalid(from, event);
      }
    case JobState::Starting:
      switch (event) {
        case JobEvent::AllRanksStarted: return Transition{JobState::Running};
        // Ranks that exit before every rank has started still end the gang.
        case JobEvent::AllRanksExitedOk: return ending(JobState::Completed);
        case JobEvent::RankFailed: return failed_or_requeued(JobState::Failed, retry_left);
        // A launch failure (no such user, missing workdir) repeats on every attempt.
        case JobEvent::LaunchFailed: return ending(JobState::Failed);
        // Not a failure of the job: the same attempt is placed again on another port. It
        // answers PREPARE, before any rank was launched: nothing to wait for.
        case JobEvent::PortBusy: return Transition{JobState::Pending};
        case JobEvent::Cancel: return ending(JobState::Cancelled);
        case JobEvent::TimeLimit: return ending(JobState::Timeout);
        case JobEvent::NodeLost: return failed_or_requeued(JobState::NodeFail, retry_left);
        // A rank that never checked in: like a rank that failed (a retry may land elsewhere).
        case JobEvent::RendezvousTimeout: return failed_or_requeued(JobState::Failed, retry_left);
        default: return invalid(from, event);
      }
    case JobState::Running:
      switch (event) {
        case JobEvent::AllRanksExitedOk: return ending(JobState::Completed);
        case JobEvent::RankFailed: return failed_or_requeued(JobState::Failed, retry_left);
        case JobEvent::Cancel: return ending(JobState::Cancelled);
        case JobEvent::TimeLimit: return ending(JobState::Timeout);
        case JobEvent::NodeLost: return failed_or_requeued(JobState::NodeFail, retry_left);
        case JobEvent::RendezvousTimeout: return failed_or_requeued(JobState::Failed, retry_left);
        default: return invalid(from, event);
      }
    case JobState::Ending:
      if (event != JobEvent::RanksGone) return invalid(from, event);
      if (!outcome || *outcome == JobState::Ending || (*outcome != JobState::Pending && !model::is_terminal(*outcome))) {
        return make_error(ErrorCode::Internal, "an ENDING job without a valid outcome");
      }
      return Transition{*outcome, *outcome == JobState::Pending};
    case JobState::Completed:
    case JobState::Failed:
    case JobState::Cancelled:
    case JobState::Timeout:
    case JobState::NodeFail:
      return invalid(from, event);
  }
  return invalid(from, event);
}

}  // namespace corral::sched
