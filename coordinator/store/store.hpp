#pragma once
// Store: the coordinator's durable state. Each Change is one state change, applied
// atomically (all of it or none of it) and durable before commit() returns; a batch of
// changes is group-committed with a single sync. SqliteStore is the real one;
// MemoryStore is its in-memory twin for tests. Both pass tests/unit/store/store_contract.
// Not thread-safe: the coordinator calls it from one thread.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job.hpp"

namespace corral::store {

// One rank of a job's current attempt, as the agents report it.
struct RankRecord {
  int rank = 0;
  std::string node;
  int local_rank = 0;
  std::vector<int> gpus;
  std::vector<std::string> gpu_uuids;
  int pid = 0;                                // 0 until started
  model::RankState state = model::RankState::Pending;
  std::optional<int> exit_code;
  std::optional<int> signal;
  // Its agent confirmed that no process of this attempt is left on the node (the rank's
  // process group is gone, and no process carries the attempt's CORRAL_JOB_ID and
  // CORRAL_ATTEMPT). Until then an ENDING job keeps this rank's GPUs.
  bool gone = false;
  // When the rank checked in to its job's rendezvous (its agent saw rank 0 listening on
  // MASTER_PORT, any other rank connected to it); unset until then, and in nccl mode.
  std::optional<TimePoint> joined_at = std::nullopt;
  // When it ended, as its agent dated it (clamped to the attempt's start and the moment
  // the coordinator heard of it); unset until then, and for a rank lost with its node.
  std::optional<TimePoint> ended_at = std::nullopt;
  // What the watch found wrong with it (a hang it stopped first in, a GPU it used that is
  // not its own), oldest first.
  std::vector<std::string> warnings = {};

  bool operator==(const RankRecord&) const = default;
};

// A person who may use the API. Tokens are stored only as SHA-256 hashes.
struct User {
  std::string name;                           // also the Unix user jobs run as
  std::string token_hash;                     // lowercase hex SHA-256 of the bearer token
  bool admin = false;

  bool operator==(const User&) const = default;
};

// What an earlier attempt of a job still holds on a node that went down before its agent
// confirmed the attempt's ranks dead: those GPUs and the attempt's master port (its ranks
// may still connect to it) serve nobody until the agent comes back and confirms, or an
// admin clears the node.
// The job itself has moved on (ended, or requeued).
struct Fence {
  int attempt = 0;
  std::string node;
  std::vector<int> gpus;
  std::string host;                           // the attempt's master port: its host
  int port = 0;                               // 0: no port fenced

  bool operator==(const Fence&) const = default;
};

// A job that is one element of an array.
struct ArrayElement {
  model::JobId job = 0;  // the array's id: its first element's
  int index = 0;         // CORRAL_ARRAY_INDEX

  bool operator==(const ArrayElement&) const = default;
};

struct JobRecord {
  model::JobId id = 0;                        // assigned by the caller, unique, > 0
  std::string user;
  std::string name;
  std::string spec_yaml;                      // the spec as submitted
  model::JobState state = model::JobState::Pending;
  std::string reason;                         // pending reason, or why it ended
  std::string detail;                         // why it ended, in words ("cannot start as user ...")
  int attempt = 0;
  TimePoint submitted_at{};
  std::optional<TimePoint> started_at;
  std::optional<TimePoint> ended_at;
  // Set while STARTING/RUNNING; kept after the end so `corral show` can say where it ran.
  std::optional<model::Allocation> allocation;
  std::string nccl_id;                        // 256 hex characters for NCCL jobs, else empty
  std::optional<int> failed_rank;
  std::string failed_node;
  std::optional<int> exit_code;
  std::vector<RankRecord> ranks;              // of the current attempt; empty while PENDING
  // While ENDING: the state it moves to once every rank is confirmed gone (a terminal
  // state, or PENDING for a requeue with attempt + 1).
  std::optional<model::JobState> outcome;
  std::vector<Fence> fences;                  // held whatever the state; see Fence
  // Where it was submitted from and the environment exported with it: written by
  // InsertJob only (UpdateJob keeps what was inserted, whatever its record says).
  model::Submission submission;
  std::optional<ArrayElement> array;          // set for an array's elements

  bool fenced() const { return !fences.empty(); }

  bool operator==(const JobRecord&) const = default;
};

struct JobEvent {
  model::JobId job = 0;
  TimePoint at{};
  std::string text;                           // "PENDING -> STARTING on gpu-a,gpu-b"

  bool operator==(const JobEvent&) const = default;
};

// Inserts a new job. Conflict if the id exists; InvalidArgument if the id is not > 0. A
// job inserted as STARTING or RUNNING holds its resources as UpdateJob describes.
struct InsertJob {
  JobRecord job;
};
// Replaces every field of an existing job. NotFound if absent. While the new state holds
// resources (STARTING, RUNNING, ENDING) the allocation's GPUs (node, index) and master port
// (master_addr, master_port) are held by this job, except, while ENDING, those of nodes
// whose every rank is confirmed gone (the port stays until the job ends); and, in any
// state, what its fences list (a port held by several of them is one hold); Conflict if another job holds any of
// them. In any other state the job holds nothing: terminal states release in the same
// transaction. InvalidArgument for STARTING/RUNNING without an allocation, or a GPU listed
// twice. Port 0 means no master port yet: none is held.
struct UpdateJob {
  JobRecord job;
};
struct AppendEvent {
  JobEvent event;
};
// Inserts or replaces a node (inventory, address, state, reason).
struct UpsertNode {
  model::Node node;
};

// Inserts or replaces a user (by name). Conflict if another user has the same token hash.
struct UpsertUser {
  User user;
};

// What one submission made, under the key its client sent with it (the Idempotency-Key
// header): a retry of that submission is answered with these jobs instead of new ones.
// A key belongs to its user: another user's same key is another key.
struct SubmitKey {
  std::string user;
  std::string key;
  model::JobId job = 0;  // the first job made (an array's id)
  int jobs = 1;          // how many, with consecutive ids from `job` (an array's elements)
  TimePoint at{};        // when it was made; pruned a day later

  bool operator==(const SubmitKey&) const = default;
};

// Records a submission's key with the jobs it made. It goes in the same Change as their
// InsertJob, so the key is on disk exactly when they are. Conflict if the user's key is
// recorded already; NotFound if `job` is not stored; InvalidArgument for an empty user or
// key, or fewer than one job.
struct RecordSubmitKey {
  SubmitKey key;
};
// Deletes at most `limit` of the keys made before `before`, the oldest first.
struct PruneSubmitKeys {
  TimePoint before{};
  int limit = 0;
};

using Mutation =
    std::variant<InsertJob, UpdateJob, AppendEvent, UpsertNode, UpsertUser, RecordSubmitKey, PruneSubmitKeys>;

// One state change: all of its mutations commit together or not at all.
struct Change {
  std::vector<Mutation> mutations;
};

struct JobQuery {
  bool include_terminal = true;
  std::optional<std::string> user;
};

// Jobs that ended in [since, until), for history and accounting.
struct EndedQuery {
  TimePoint since{};
  std::optional<TimePoint> until;
  std::size_t limit = 0;  // 0: no limit
  std::vector<std::string> users = {};         // empty: every user's
  std::vector<model::JobState> states = {};    // empty: every end state
};

// What GPU time is summed by: the job's user, the node, or the GPU's product name (from
// the node's stored inventory; "unknown" for a GPU no node lists now).
enum class UsageKey { User, Node, Class };
struct UsageRow {
  std::string key;
  std::int64_t gpu_ms = 0;  // GPU-milliseconds within the range
  std::int64_t jobs = 0;    // distinct jobs that used them

  bool operator==(const UsageRow&) const = default;
};

// Everything the coordinator needs to rebuild its state after a restart.
struct Snapshot {
  std::vector<model::Node> nodes;
  std::vector<JobRecord> active_jobs;         // not terminal, or holding fences
  model::JobId max_job_id = 0;                // over all jobs ever stored
};

class Store {
 public:
  virtual ~Store() = default;

  // Applies the changes in order, each atomically; a change refused for its content is
  // rolled back alone and the others still apply. When the store cannot write at all
  // (Unavailable, ResourceExhausted, PermissionDenied: disk full, read-only, I/O error),
  // nothing of the batch applies and every result carries that error. Returns one result
  // per change, after all applied changes are durable.
  virtual std::vector<Result<void>> commit(std::span<const Change> changes) = 0;
  Result<void> commit(const Change& change) { return commit(std::span<const Change>(&change, 1)).front(); }

  virtual Result<Snapshot> load() = 0;
  virtual Result<std::optional<JobRecord>> job(model::JobId id) = 0;
  // The id of array `array`'s element `index`, if there is one.
  virtual Result<std::optional<model::JobId>> array_element(model::JobId array, int index) = 0;
  // Ordered by id.
  virtual Result<std::vector<JobRecord>> jobs(const JobQuery& query) = 0;
  // Ended jobs (terminal states) by end time, then id, the first `limit`; each without
  // its spec, ranks, fences and submission, which a history does not show.
  virtual Result<std::vector<JobRecord>> ended_jobs(const EndedQuery& query) = 0;
  // The GPU time of the ended jobs of `query` (its users too; its limit and states
  // ignored) that falls within
  // [since, until) (until required), each GPU of the allocation counted from the job's
  // start to its end; ordered by key.
  virtual Result<std::vector<UsageRow>> gpu_usage(const EndedQuery& query, UsageKey by) = 0;
  // In the order they were appended.
  virtual Result<std::vector<JobEvent>> events(model::JobId id) = 0;
  virtual Result<std::optional<User>> user_by_token_hash(const std::string& token_hash) = 0;
  // The jobs that `user`'s submission with this key made, if it is recorded.
  virtual Result<std::optional<SubmitKey>> submit_key(const std::string& user, const std::string& key) = 0;
  // Ordered by name.
  virtual Result<std::vector<User>> users() = 0;
};

}  // namespace corral::store
