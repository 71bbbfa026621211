#pragma once
// SqliteStore: the coordinator's Store on one SQLite file. WAL mode with synchronous=FULL,
// so a commit() that returned is on disk even if the power goes next; a batch of changes
// is one transaction (one sync), each change in its own savepoint. The GPU and port hold
// tables have primary keys that make a double hold impossible at the database level.
// Lives on the coordinator's store thread, like every Store: not thread-safe.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "coordinator/store/store.hpp"

namespace corral::store {

class SqliteConnection;

struct SqliteStoreOptions {
  // How long a statement waits for another process's lock (a backup, the sqlite3 shell)
  // before the commit fails with Unavailable.
  std::chrono::milliseconds busy_timeout{5000};
  // A second connection that only reads (the coordinator's history reader): its schema is
  // brought up to date like any, then `PRAGMA query_only` makes every write on it fail.
  bool query_only = false;
};

class SqliteStore final : public Store {
 public:
  using Options = SqliteStoreOptions;

  // Opens or creates the database and brings its schema up to date. Conflict when the
  // file's schema is newer than this build; Internal or Unavailable, with SQLite's reason
  // and the path, when the file is not a database or cannot be opened.
  [[nodiscard]] static Result<std::unique_ptr<SqliteStore>> open(const std::string& path,
                                                                 Options options = {});
  ~SqliteStore() override;

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

  // For diagnostics and tests: the value of `PRAGMA <name>` on this connection as text
  // ("journal_mode" -> "wal", "synchronous" -> "2"). InvalidArgument unless name is
  // made of [a-z_].
  [[nodiscard]] Result<std::string> pragma(std::string_view name);
  const std::string& path() const;

  // The cluster this database belongs to; nullopt in a database made before identities
  // (or by open() just now).
  [[nodiscard]] Result<std::optional<std::string>> cluster_identity();
  // Conflict when the database already belongs to a cluster.
  [[nodiscard]] Result<void> set_cluster_identity(std::string_view identity);
  // Whether the database holds a user or a job: what a cluster that ever ran has.
  [[nodiscard]] Result<bool> holds_anything();

 private:
  explicit SqliteStore(std::unique_ptr<SqliteConnection> db);

  Result<void> apply_change(const Change& change);
  Result<void> apply(const InsertJob& m);
  Result<void> apply(const UpdateJob& m);
  Result<void> apply(const AppendEvent& m);
  Result<void> apply(const UpsertNode& m);
  Result<void> apply(const UpsertUser& m);
  Result<void> apply(const RecordSubmitKey& m);
  Result<void> apply(const PruneSubmitKeys& m);
  Result<void> hold_resources(const JobRecord& job);
  Result<std::vector<JobRecord>> select_jobs(std::string_view sql, const JobQuery& query);

  std::unique_ptr<SqliteConnection> db_;
};

}  // namespace corral::store
