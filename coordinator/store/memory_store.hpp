#pragma once
// MemoryStore: the Store kept in maps, for tests and simulations. Same semantics as
// SqliteStore, checked by the same contract suite: each Change is atomic (undone alone
// when one of its mutations fails), a GPU or (host, port) is never held twice, and the
// errors carry the same codes and messages. Nothing survives the object.
// Not thread-safe, like every Store.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "coordinator/store/store.hpp"
#include "coordinator/store/store_rules.hpp"

namespace corral::store {

class MemoryStore : public Store {
 public:
  std::vector<Result<void>> commit(std::span<const Change> changes) override;
  using Store::commit;
  Result<Snapshot> load() override;
  Result<std::optional<JobRecord>> job(model::JobId id) override;
  Result<std::vector<JobRecord>> jobs(const JobQuery& query) override;
  Result<std::optional<model::JobId>> array_element(model::JobId array, int index) override;
  Result<std::vector<JobRecord>> ended_jobs(const EndedQuery& query) override;
  Result<std::vector<UsageRow>> gpu_usage(const EndedQuery& query, UsageKey by) override;
  Result<std::vector<JobEvent>> events(model::JobId id) override;
  Result<std::optional<User>> user_by_token_hash(const std::string& token_hash) override;
  Result<std::vector<User>> users() override;
  Result<std::optional<SubmitKey>> submit_key(const std::string& user, const std::string& key) override;

 private:
  Result<void> apply_change(const Change& change);
  Result<void> apply(const InsertJob& m);
  Result<void> apply(const UpdateJob& m);
  Result<void> apply(const AppendEvent& m);
  Result<void> apply(const UpsertNode& m);
  Result<void> apply(const UpsertUser& m);
  Result<void> apply(const RecordSubmitKey& m);
  Result<void> apply(const PruneSubmitKeys& m);
  Result<void> hold_resources(const JobRecord& job);
  // Sets jobs_[job.id] and records how to put back what was there.
  void put_job(JobRecord job);

  std::map<model::JobId, JobRecord> jobs_;
  std::map<model::JobId, std::vector<JobEvent>> events_;
  std::map<std::string, model::Node, std::less<>> nodes_;
  std::map<GpuKey, model::JobId> gpu_holds_;
  std::map<PortKey, model::JobId> port_holds_;
  std::map<std::string, User, std::less<>> users_;  // by name, hence users() in name order
  std::map<std::pair<std::string, std::string>, SubmitKey> submit_keys_;  // by (user, key)
  // Undo steps of the change being applied, run in reverse when it fails.
  std::vector<std::function<void()>> undo_;
};

}  // namespace corral::store
