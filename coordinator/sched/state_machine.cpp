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
  }
  return "Unknown";
}

namespace {

Result<Transition> invalid(JobState from, JobEvent event) {
  return make_error(ErrorCode::Conflict, std::string("event ") + std::string(to_string(event)) +
                                             " does not apply to a " + std::string(model::to_string(from)) +
                                             " job");
}

Transition failed_or_requeued(JobState failure, bool retry_left) {
  if (retry_left) return {JobState::Pending, true};
  return {failure, false};
}

}  // namespace

Result<Transition> next_state(JobState from, JobEvent event, bool retry_left) {
  switch (from) {
    case JobState::Pending:
      switch (event) {
        case JobEvent::Schedule: return Transition{JobState::Starting};
        case JobEvent::Cancel: return Transition{JobState::Cancelled};
        default: return invalid(from, event);
      }
    case JobState::Starting:
      switch (event) {
        case JobEvent::AllRanksStarted: return Transition{JobState::Running};
        // Ranks that exit before every rank has started still end the gang.
        case JobEvent::AllRanksExitedOk: return Transition{JobState::Completed};
        case JobEvent::RankFailed: return failed_or_requeued(JobState::Failed, retry_left);
        // A launch failure (no such user, missing workdir) repeats on every attempt.
        case JobEvent::LaunchFailed: return Transition{JobState::Failed};
        // Not a failure of the job: the same attempt is placed again on another port.
        case JobEvent::PortBusy: return Transition{JobState::Pending};
        case JobEvent::Cancel: return Transition{JobState::Cancelled};
        case JobEvent::TimeLimit: return Transition{JobState::Timeout};
        case JobEvent::NodeLost: return failed_or_requeued(JobState::NodeFail, retry_left);
        default: return invalid(from, event);
      }
    case JobState::Running:
      switch (event) {
        case JobEvent::AllRanksExitedOk: return Transition{JobState::Completed};
        case JobEvent::RankFailed: return failed_or_requeued(JobState::Failed, retry_left);
        case JobEvent::Cancel: return Transition{JobState::Cancelled};
        case JobEvent::TimeLimit: return Transition{JobState::Timeout};
        case JobEvent::NodeLost: return failed_or_requeued(JobState::NodeFail, retry_left);
        default: return invalid(from, event);
      }
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
