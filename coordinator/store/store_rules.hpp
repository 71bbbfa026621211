#pragma once
// The rules both Store implementations enforce, and their error messages, written once so
// that SqliteStore and MemoryStore cannot drift apart: what a job record and a user must
// satisfy, which GPUs and port a job holds, and how a refused hold, a taken token or a
// missing job is reported.

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "coordinator/store/store.hpp"

namespace corral::store {

struct GpuKey {
  std::string node;
  int index = 0;

  auto operator<=>(const GpuKey&) const = default;
};

struct PortKey {
  std::string host;
  int port = 0;

  auto operator<=>(const PortKey&) const = default;
};

// What InsertJob and UpdateJob accept: an id > 0, and an allocation whenever the state
// holds resources (a STARTING job without GPUs is a scheduler bug worth refusing loudly).
[[nodiscard]] Result<void> check_job_record(const JobRecord& job);

// The nodes an ENDING job has let go of: every one of its ranks there is confirmed gone, or
// what it held there became a fence. Empty in other states. One pass over the ranks (a
// gang of a thousand nodes asked node by node would be a million rank visits).
std::set<std::string> released_nodes(const JobRecord& job);
// The GPUs and master port a job in this record holds: none unless its state holds
// resources, and while ENDING none on released nodes (the port stays with the job until it
// ends), plus what its fences hold. Each port appears once.
// Each GPU appears as often as the allocation lists it.
std::vector<GpuKey> gpus_held_by(const JobRecord& job);
std::vector<PortKey> ports_held_by(const JobRecord& job);

// Folds `next` into `into` when each changes one and the same job alone (its UpdateJob
// first, then only that job's events): the later record replaces the earlier (an UpdateJob
// replaces every field anyway) and the events keep their order, so committing the folded
// change leaves what committing both in turn would. A job whose every rank reports on its
// own is then written once per batch, not once per rank. False, and nothing moved, when
// they do not fold.
bool fold_job_update(Change& into, Change& next);

// Whether an error says the store cannot write at all now (disk full, read-only, an I/O
// error, a lock held elsewhere), which passes, rather than that one change was refused
// for its content: a batch failed so is failed whole and may be written again as it is.
bool cannot_write(const Error& error);

// What UpsertUser accepts: a name of 1 to 64 characters of [A-Za-z0-9._-] (it is also a
// Unix user name) and a token hash of exactly 64 lowercase hex characters.
[[nodiscard]] Result<void> check_user(const User& user);
// Conflict: `user` was given a token hash that `holder` already has. Names the holder,
// never the hash, which would help whoever reads the log to impersonate them.
Error token_taken_error(std::string_view holder, std::string_view user);
// What RecordSubmitKey accepts: a user and a key that are not empty, at least one job.
[[nodiscard]] Result<void> check_submit_key(const SubmitKey& key);
// Conflict: the user's key is recorded already. Names the user, not the key.
Error submit_key_exists_error(const SubmitKey& key);
Error job_exists_error(model::JobId id);
Error job_not_found_error(model::JobId id, std::string_view action);
// holder == job: the allocation lists the GPU twice (InvalidArgument); otherwise another
// job holds it (Conflict).
Error gpu_held_error(const GpuKey& gpu, model::JobId holder, model::JobId job);
// holder == job: the job lists the port twice (InvalidArgument); otherwise Conflict.
Error port_held_error(const PortKey& port, model::JobId holder, model::JobId job);

}  // namespace corral::store
