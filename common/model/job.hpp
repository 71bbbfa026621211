#pragma once
// Job lifecycle values shared by the coordinator, the store, the protocol and the CLI.

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/job_spec.hpp"

namespace corral::model {

using JobId = std::int64_t;

// ENDING: the outcome is decided (completed, failed, cancelled, timed out, requeued), but
// the job keeps its GPUs and master port until every agent has confirmed that no process
// of the attempt is left (like Slurm's COMPLETING).
enum class JobState { Pending, Starting, Running, Ending, Completed, Failed, Cancelled, Timeout, NodeFail };
inline constexpr JobState kAllJobStates[] = {JobState::Pending,   JobState::Starting, JobState::Running,
                                             JobState::Ending,    JobState::Completed, JobState::Failed,
                                             JobState::Cancelled, JobState::Timeout,  JobState::NodeFail};
inline constexpr int kJobStateCount = static_cast<int>(std::size(kAllJobStates));
// "PENDING", "NODE_FAIL", ...
std::string_view to_string(JobState state);
std::optional<JobState> parse_job_state(std::string_view text);
bool is_terminal(JobState state);
// STARTING, RUNNING or ENDING: the job holds GPUs and a port.
bool holds_resources(JobState state);

// One rank of an attempt, as the coordinator knows it. PENDING: not started yet;
// RUNNING: its agent reported it started; EXITED: it ended by itself (exit code or
// signal); KILLED: it ended after the coordinator asked its agent to kill it; LOST: its
// agent does not know it (after a restart or reconnect) or never came back.
enum class RankState { Pending, Running, Exited, Killed, Lost };
inline constexpr RankState kAllRankStates[] = {RankState::Pending, RankState::Running, RankState::Exited,
                                               RankState::Killed, RankState::Lost};
std::string_view to_string(RankState state);
std::optional<RankState> parse_rank_state(std::string_view text);
// The rank's process is over (it may still have left processes behind: see `gone`).
inline bool rank_ended(RankState s) { return s == RankState::Exited || s == RankState::Killed || s == RankState::Lost; }

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
