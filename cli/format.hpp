#pragma once
// What `corral` prints for people: tables and summaries built from the coordinator's
// answers (views.hpp). Pure functions of their inputs and `now`, so tests compare exact
// text. Text that came from the coordinator is printed with control characters
// replaced, so a job name cannot move the cursor or retitle the terminal.

#include <string>
#include <string_view>
#include <vector>

#include "cli/views.hpp"
#include "common/core/time.hpp"

namespace corral::cli {

// Like Slurm: "M:SS" under an hour, "H:MM:SS" under a day, else "D-HH:MM:SS"; whole
// seconds, rounded down; negative durations print as "0:00".
std::string format_elapsed(Duration d);
// A time limit in seconds, or "UNLIMITED".
std::string format_time_limit(const std::optional<double>& seconds);

// COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL.
bool is_terminal_state(std::string_view state);

// How long the job ran: from started_at to ended_at, or to `now` while it runs; zero
// before it started.
Duration job_run_time(const JobInfo& job, TimePoint now);

// ID NAME USER STATE REASON NODES GPUS TIME TIME_LIMIT, one job a line.
// "42", or "42_7" for element 7 of array 42.
std::string job_ref(const JobInfo& job);
std::string format_queue(const std::vector<JobInfo>& jobs, TimePoint now);
// `corral history`: ended jobs with their outcome, exit code (and failing rank), run time.
std::string format_history(const std::vector<JobInfo>& jobs, TimePoint now);
// `corral usage`: GPU-hours per user, node or class, with the total.
std::string format_usage(const UsageInfo& usage);
// Every field, the per-rank table and the event log.
// corral stack: each rank's report under a header naming it and its node.
std::string format_stacks(const std::vector<RankStackInfo>& ranks);
std::string format_job(const JobInfo& job, TimePoint now);
// A line per node, from a listing by class: its state, how many GPUs it has and how many a
// job holds, their class.
std::string format_node_summary(const std::vector<NodeInfo>& nodes);
// A line per node and, under it, a line per GPU (`corral nodes --gpus`).
std::string format_nodes(const std::vector<NodeInfo>& nodes);
// Where a dry run would start the job, or why it would wait.
std::string format_dry_run(const DryRunInfo& dry_run);
// "Job 42 COMPLETED" or "Job 42 FAILED: RankFailed: rank 1 on gpu-b exited with code 3".
std::string format_end_state(const JobInfo& job);
// One line saying what state a node is in now, after drain or resume.
std::string format_node_state(const NodeInfo& node);

}  // namespace corral::cli
