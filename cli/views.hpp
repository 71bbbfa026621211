#pragma once
// The coordinator's answers (docs/api.md) read into plain values for printing. Parsing
// is lenient about fields it does not know or that are absent (older or newer
// coordinators) and strict about types: a mistyped field is an Internal error naming it.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral::cli {

struct RankInfo {
  int rank = 0;
  std::string node;
  int local_rank = 0;
  std::vector<int> gpus;
  std::vector<std::string> gpu_uuids;
  std::optional<std::int64_t> pid;
  std::string state;  // PENDING, RUNNING, EXITED, KILLED, LOST
  std::optional<int> exit_code;
  std::optional<int> signal;
  bool gone = false;  // its agent confirmed nothing of it is left
  std::string joined_at;  // RFC 3339: when it checked in to the rendezvous; empty until then
  std::vector<std::string> warnings;  // what the watch found wrong with it
};

// Torch mode: who checked in to the rendezvous.
struct RendezvousInfo {
  int ranks = 0;
  int joined = 0;
  std::optional<std::int64_t> complete_after_ms;
  std::vector<std::pair<int, std::string>> waiting_for;  // (rank, node) not checked in, alive
  double timeout_s = 0;  // 0: no deadline
};

struct EventInfo {
  std::string at;  // RFC 3339, as the coordinator wrote it
  std::string text;
};

struct JobInfo {
  std::int64_t id = 0;
  std::string name;
  std::string user;
  std::string state;
  std::string reason;
  std::string detail;
  int attempt = 0;
  int retries = 0;
  int priority = 0;
  int nodes = 0;
  int gpus = 0;
  std::optional<double> time_limit_s;  // nullopt: no limit
  std::string submitted_at;            // RFC 3339 text, or empty
  std::string started_at;
  std::string ended_at;
  std::string master_addr;
  std::optional<int> master_port;
  std::vector<std::string> node_list;  // the allocation's nodes, in order
  std::optional<int> failed_rank;
  std::string failed_node;
  std::optional<int> exit_code;
  std::string outcome;  // ENDING: the state it takes once every rank is gone
  // What earlier attempts still hold on nodes lost before confirming, as text per fence
  // ("gpu-b: GPUs 0,1 and port 29500 (attempt 0)").
  std::vector<std::string> fences;
  std::vector<RankInfo> ranks;
  std::optional<RendezvousInfo> rendezvous;
  std::vector<std::pair<std::string, std::int64_t>> dependencies;  // (after_ok, 41), in spec order
  // An array's element: the array's id, its index, the array's "%N" (0: none).
  std::optional<std::int64_t> array_job;
  int array_index = 0;
  int array_max_running = 0;
  std::vector<std::int64_t> array_cancelled;  // cancel of an array: the elements cancelled
  std::vector<EventInfo> events;

  // The allocation's node names: node_list, or else the ranks' nodes in rank order.
  std::vector<std::string> node_names() const;
};

struct GpuInfo {
  int index = 0;
  std::string uuid;
  std::string name;
  std::int64_t memory_mib = 0;
  std::string driver;
  std::string cuda;
  std::optional<std::int64_t> job;  // the job holding it, when the viewer may see it
  bool held = false;                // held by a job (named or not: private_data: jobs)
};

// A node's GPUs of one class, as GET /v1/nodes?gpus=classes lists them.
struct GpuClassInfo {
  std::string name;
  std::int64_t memory_mib = 0;
  std::string driver;
  std::string cuda;
  int count = 0;
  int used = 0;  // held by a job
};

struct NodeInfo {
  std::string name;
  std::string address;
  std::string state;  // up, down, drained
  std::string reason;
  bool simulated = false;
  bool connected = false;
  std::string last_seen;
  // Its agent away or silent: since when, and when the node is lost if that goes on
  // (empty otherwise, and from a coordinator that does not say).
  std::string silent_since;
  std::string lost_at;
  std::string driver;
  std::string cuda;
  std::vector<GpuInfo> gpus;
  std::vector<GpuClassInfo> gpu_classes;  // instead of gpus, in a listing by class
};

struct DryRunInfo {
  bool would_start = false;
  std::vector<std::pair<std::string, std::vector<int>>> allocation;  // node, GPU indices
  std::string master_addr;
  std::optional<int> master_port;
  std::string reason;
  std::string detail;
};

struct LogChunk {
  int rank = 0;
  std::string node;
  std::uint64_t offset = 0;
  std::string data;
  std::uint64_t size = 0;
  bool finished = false;
  std::uint64_t cut = 0;  // bytes cut from the log's middle (the node's rank_log_cap)
  std::string lost;       // why output may be missing from the log, or ""
};

[[nodiscard]] Result<JobInfo> parse_job(std::string_view json);
[[nodiscard]] Result<std::vector<JobInfo>> parse_jobs(std::string_view json);
[[nodiscard]] Result<std::vector<NodeInfo>> parse_nodes(std::string_view json);
[[nodiscard]] Result<NodeInfo> parse_node(std::string_view json);
[[nodiscard]] Result<DryRunInfo> parse_dry_run(std::string_view json);
[[nodiscard]] Result<std::int64_t> parse_submitted_id(std::string_view json);
// Every id a submission made: one, or each element of an array.
[[nodiscard]] Result<std::vector<std::int64_t>> parse_submitted_ids(std::string_view json);
[[nodiscard]] Result<LogChunk> parse_log_chunk(std::string_view json);

// GET /v1/jobs/ID/stack: one report per rank.
struct RankStackInfo {
  int rank = 0;
  std::string node;
  std::string report;
};
[[nodiscard]] Result<std::vector<RankStackInfo>> parse_stacks(std::string_view json);
// GET /v1/usage
struct UsageInfo {
  std::string since;
  std::string until;
  std::string by;  // user, node or class
  struct Row {
    std::string key;
    double gpu_hours = 0;
    std::int64_t jobs = 0;
  };
  std::vector<Row> rows;
  double total_gpu_hours = 0;
  bool own_only = false;  // the coordinator keeps usage private: the caller's jobs alone
};
[[nodiscard]] Result<UsageInfo> parse_usage(std::string_view json);

// POST /v1/jobs/cancel: (id, state) of each job cancelled, (id, message) of each refused.
struct BulkCancelInfo {
  std::vector<std::pair<std::int64_t, std::string>> cancelled;
  std::vector<std::pair<std::int64_t, std::string>> failed;
};
[[nodiscard]] Result<BulkCancelInfo> parse_bulk_cancel(std::string_view json);

// The "problems" list of a 400 answer to a submit; empty when there is none.
std::vector<std::string> parse_problems(std::string_view json);

// The answer re-printed for --json: indented by two spaces, keys in the coordinator's
// order, ending in a newline. Internal when it is not JSON.
[[nodiscard]] Result<std::string> pretty_json(std::string_view json);

// "2026-12-02T10:00:00.123Z" (fraction optional; "Z" or "+hh:mm"/"-hh:mm").

}  // namespace corral::cli
