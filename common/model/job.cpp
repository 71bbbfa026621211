#include "common/model/job.hpp"

#include "common/core/enum_names.hpp"

namespace corral::model {

std::string_view to_string(JobState state) {
  switch (state) {
    case JobState::Pending: return "PENDING";
    case JobState::Starting: return "STARTING";
    case JobState::Running: return "RUNNING";
    case JobState::Ending: return "ENDING";
    case JobState::Completed: return "COMPLETED";
    case JobState::Failed: return "FAILED";
    case JobState::Cancelled: return "CANCELLED";
    case JobState::Timeout: return "TIMEOUT";
    case JobState::NodeFail: return "NODE_FAIL";
  }
  return "UNKNOWN";
}

std::optional<JobState> parse_job_state(std::string_view text) { return parse_enum_name(kAllJobStates, text); }

bool is_terminal(JobState state) {
  switch (state) {
    case JobState::Completed:
    case JobState::Failed:
    case JobState::Cancelled:
    case JobState::Timeout:
    case JobState::NodeFail:
      return true;
    default:
      return false;
  }
}

bool holds_resources(JobState state) {
  return state == JobState::Starting || state == JobState::Running || state == JobState::Ending;
}

std::string_view to_string(RankState state) {
  switch (state) {
    case RankState::Pending: return "PENDING";
    case RankState::Running: return "RUNNING";
    case RankState::Exited: return "EXITED";
    case RankState::Killed: return "KILLED";
    case RankState::Lost: return "LOST";
  }
  return "UNKNOWN";
}

std::optional<RankState> parse_rank_state(std::string_view text) { return parse_enum_name(kAllRankStates, text); }

std::vector<RankAssignment> assign_ranks(const JobSpec& spec, const Allocation& alloc) {
  std::vector<RankAssignment> ranks;
  int rank = 0;
  for (std::size_t n = 0; n < alloc.nodes.size(); ++n) {
    const auto& node = alloc.nodes[n];
    int gpus = static_cast<int>(node.gpus.size());
    int procs = spec.procs_per_node > 0 ? spec.procs_per_node : gpus;
    if (procs <= 0) procs = 1;
    int per_proc = gpus / procs;
    for (int local = 0; local < procs; ++local) {
      RankAssignment r;
      r.rank = rank++;
      r.node_rank = static_cast<int>(n);
      r.local_rank = local;
      r.local_world_size = procs;
      r.node = node.node;
      for (int g = 0; g < per_proc; ++g) r.gpus.push_back(node.gpus[static_cast<std::size_t>(local * per_proc + g)]);
      ranks.push_back(std::move(r));
    }
  }
  return ranks;
}

}  // namespace corral::model
