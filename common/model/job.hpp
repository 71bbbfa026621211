#pragma once
// Job lifecycle values shared by the coordinator, the store, the protocol and the CLI.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/job_spec.hpp"

namespace corral::model {

using JobId = std::int64_t;

enum class JobState { Pending, Starting, Running, Completed, Failed, Cancelled, Timeout, NodeFail };
inline constexpr JobState kAllJobStates[] = {JobState::Pending,   JobState::Starting,  JobState::Running,
                                             JobState::Completed, JobState::Failed,    JobState::Cancelled,
                                             JobState::Timeout,   JobState::NodeFail};
// "PENDING", "NODE_FAIL", ...
std::string_view to_string(JobState state);
std::optional<JobState> parse_job_state(std::string_view text);
bool is_terminal(JobState state);
// STARTING or RUNNING: the job holds GPUs and a port.
bool holds_resources(JobState state);

// The GPUs of one node given to a job, in allocation order.
struct NodeAllocation {
  std::string node;
  std::vector<int> gpus;     // GPU indices on that node

  bool operator==(const NodeAllocation&) const = default;
};

// Where a job runs: node 0 hosts rank 0 and the master port.
struct Allocation {
  std::vector<NodeAllocation> nodes;
  std::string master_addr;   // node 0's advertised address
  int master_port = 0;

  bool operator==(const Allocation&) const = default;
};

// One process of the job, as the agents start it.
struct RankAssignment {
  int rank = 0;
  int node_rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
  std::string node;
  std::vector<int> gpus;     // node-local GPU indices this rank sees (CUDA_VISIBLE_DEVICES)
};

// Ranks in order: node by node, local ranks within a node.
std::vector<RankAssignment> assign_ranks(const JobSpec& spec, const Allocation& alloc);

}  // namespace corral::model
