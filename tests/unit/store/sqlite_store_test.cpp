// What only SqliteStore promises: durability across reopen, the pragmas that make it
// durable, schema versioning, and clear errors for files it cannot use.

#include "coordinator/store/sqlite_store.hpp"

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "coordinator/store/sqlite_schema.hpp"
#include "tests/unit/store/temp_dir.hpp"

namespace corral::store {
namespace {

using ::testing::HasSubstr;

// The file opened with the plain sqlite3 API, to see what is on disk rather than what
// the store says.
class RawDb {
 public:
  explicit RawDb(const std::string& path, int flags = SQLITE_OPEN_READWRITE) {
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "sqlite3_open_v2 " << path << ": " << sqlite3_errmsg(db_);
    }
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  // The extended result code, for statements expected to fail.
  int try_exec(const std::string& sql) {
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? rc : sqlite3_extended_errcode(db_);
  }
  void exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << (err != nullptr ? err : "?");
    }
    sqlite3_free(err);
  }
  // Column `column` of the first row; empty when there is no row.
  std::string text(const std::string& sql, int column = 0) {
    sqlite3_stmt* stmt = nullptr;
    std::string out;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
      return out;
    }
    if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_type(stmt, column) != SQLITE_NULL) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, column));
    }
    sqlite3_finalize(stmt);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

std::unique_ptr<SqliteStore> open_ok(const std::string& path) {
  auto store = SqliteStore::open(path);
  EXPECT_TRUE(store.has_value()) << store.error().to_string();
  return store ? std::move(*store) : nullptr;
}

JobRecord running_job(model::JobId id) {
  JobRecord job;
  job.id = id;
  job.user = "ada";
  job.name = "train";
  job.spec_yaml = "name: train\n";
  job.state = model::JobState::Running;
  job.attempt = 1;
  job.submitted_at = from_millis(1'700'000'000'123);
  job.started_at = from_millis(1'700'000'000'456);
  job.allocation = model::Allocation{{{"gpu-a", {0, 1}}}, "10.0.0.1", 29500};
  job.nccl_id = std::string(256, 'f');
  return job;
}

model::Node gpu_node() {
  model::Node node;
  node.name = "gpu-a";
  node.address = "10.0.0.1";
  node.state = model::NodeState::Up;
  model::Gpu gpu;
  gpu.uuid = "GPU-1";
  gpu.cls = {"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"};
  gpu.cuda = {12, 4};
  node.gpus.push_back(gpu);
  return node;
}

TEST(SqliteStore, DataSurvivesCloseAndReopen) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  {
    auto store = open_ok(path);
    ASSERT_NE(store, nullptr);
    Change c;
    c.mutations = {InsertJob{running_job(3)}, AppendEvent{{3, from_millis(5), "PENDING -> RUNNING"}},
                   UpsertNode{gpu_node()}};
    ASSERT_TRUE(store->commit(c).has_value());
  }
  auto store = open_ok(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->job(3).value(), running_job(3));
  EXPECT_EQ(store->events(3).value(), (std::vector<JobEvent>{{3, from_millis(5), "PENDING -> RUNNING"}}));
  auto snap = store->load();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->nodes, std::vector<model::Node>{gpu_node()});
  EXPECT_EQ(snap->max_job_id, 3);
  // The holds came back too: job 4 cannot take job 3's GPU.
  JobRecord other = running_job(4);
  other.allocation->master_port = 29501;
  auto r = store->commit(Change{{InsertJob{other}}});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
}

TEST(SqliteStore, AQueryOnlyConnectionReadsWhatTheWriterCommittedAndRefusesEveryWrite) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  auto writer = open_ok(path);
  ASSERT_NE(writer, nullptr);
  auto reader = SqliteStore::open(path, {.query_only = true});
  ASSERT_TRUE(reader.has_value()) << reader.error().to_string();
  EXPECT_EQ((*reader)->pragma("query_only").value(), "1");
  EXPECT_EQ(writer->pragma("query_only").value(), "0");
  ASSERT_TRUE(writer->commit(Change{{InsertJob{running_job(3)}}}).has_value());
  EXPECT_EQ((*reader)->job(3).value(), running_job(3));
  auto refused = (*reader)->commit(Change{{InsertJob{running_job(4)}}});
  ASSERT_FALSE(refused.has_value());
  EXPECT_THAT(refused.error().message(), HasSubstr("readonly"));
  EXPECT_EQ(writer->job(4).value(), std::nullopt);
}

TEST(SqliteStore, WalFullSyncForeignKeysAndBusyTimeoutAreInEffect) {
  testing::TempDir dir;
  auto store = SqliteStore::open(dir.file("corral.db"), {.busy_timeout = std::chrono::milliseconds(1234)});
  ASSERT_TRUE(store.has_value()) << store.error().to_string();
  EXPECT_EQ((*store)->pragma("journal_mode").value(), "wal");
  EXPECT_EQ((*store)->pragma("synchronous").value(), "2");  // FULL
  EXPECT_EQ((*store)->pragma("foreign_keys").value(), "1");
  EXPECT_EQ((*store)->pragma("busy_timeout").value(), "1234");
  // WAL is a property of the file, seen by any other connection.
  RawDb raw(dir.file("corral.db"));
  EXPECT_EQ(raw.text("PRAGMA journal_mode"), "wal");
}

TEST(SqliteStore, PragmaAccessorRefusesAnythingButAName) {
  testing::TempDir dir;
  auto store = open_ok(dir.file("corral.db"));
  ASSERT_NE(store, nullptr);
  auto r = store->pragma("user_version; DROP TABLE jobs");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
}

TEST(SqliteStore, UserVersionIsTheLatestSchemaVersion) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  ASSERT_NE(open_ok(path), nullptr);
  ASSERT_NE(open_ok(path), nullptr);  // a second open finds nothing to migrate
  RawDb raw(path);
  EXPECT_EQ(raw.text("PRAGMA user_version"), std::to_string(latest_sqlite_schema_version()));
  EXPECT_GE(latest_sqlite_schema_version(), 1);
  EXPECT_EQ(raw.text("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN "
                     "('jobs', 'job_events', 'nodes', 'gpu_holds', 'port_holds', 'users')"),
            "6");
}

TEST(SqliteStore, MigrationsAreNumberedOneByOne) {
  int expected = 1;
  for (const auto& m : sqlite_migrations()) EXPECT_EQ(m.version, expected++);
}

TEST(SqliteStore, NewerSchemaVersionIsRefusedWithConflict) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  ASSERT_NE(open_ok(path), nullptr);
  RawDb(path).exec("PRAGMA user_version = 9999");
  auto store = SqliteStore::open(path);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code(), ErrorCode::Conflict);
  EXPECT_THAT(store.error().message(), HasSubstr("schema version 9999 is newer than this build"));
  EXPECT_THAT(store.error().message(), HasSubstr(path));
}

TEST(SqliteStore, FileThatIsNotADatabaseIsRefusedWithAClearError) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  std::ofstream(path) << "jobs:\n  - this is a YAML file someone put here by mistake, "
                         "long enough to fill a database header and then some.\n";
  auto store = SqliteStore::open(path);
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.error().message(), HasSubstr("file is not a database"));
  EXPECT_THAT(store.error().message(), HasSubstr(path));
}

TEST(SqliteStore, CorruptSchemaPageIsRefusedWithAClearError) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  {
    auto store = open_ok(path);
    ASSERT_NE(store, nullptr);
    // Checkpoint so the schema lives in the main file, then close (which removes the WAL).
    ASSERT_TRUE(store->pragma("wal_checkpoint").has_value());
  }
  {
    // Keep the 100-byte header, overwrite the rest of page 1: the schema table's b-tree.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    std::string junk(3000, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto store = SqliteStore::open(path);
  ASSERT_FALSE(store.has_value());
  EXPECT_THAT(store.error().message(), HasSubstr("malformed"));
  EXPECT_THAT(store.error().message(), HasSubstr(path));
}

TEST(SqliteStore, MissingDirectoryIsUnavailableNamingThePath) {
  testing::TempDir dir;
  std::string path = dir.file("no/such/dir/corral.db");
  auto store = SqliteStore::open(path);
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code(), ErrorCode::Unavailable);
  EXPECT_THAT(store.error().message(), HasSubstr(path));
}

TEST(SqliteStore, DoubleHoldIsImpossibleEvenBypassingTheStore) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  {
    auto store = open_ok(path);
    ASSERT_NE(store, nullptr);
    JobRecord other = running_job(2);
    other.state = model::JobState::Pending;
    ASSERT_TRUE(store->commit(Change{{InsertJob{running_job(1)}, InsertJob{other}}}).has_value());
  }
  RawDb raw(path);
  EXPECT_EQ(raw.text("SELECT count(*) FROM gpu_holds WHERE job_id = 1"), "2");
  EXPECT_EQ(raw.text("SELECT count(*) FROM port_holds WHERE job_id = 1"), "1");
  char* err = nullptr;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  int rc = sqlite3_exec(db, "INSERT INTO gpu_holds (node, gpu_index, job_id) VALUES ('gpu-a', 0, 2)", nullptr,
                        nullptr, &err);
  EXPECT_EQ(rc, SQLITE_CONSTRAINT);
  sqlite3_free(err);
  rc = sqlite3_exec(db, "INSERT INTO port_holds (host, port, job_id) VALUES ('10.0.0.1', 29500, 2)", nullptr,
                    nullptr, &err);
  EXPECT_EQ(rc, SQLITE_CONSTRAINT);
  sqlite3_free(err);
  sqlite3_close_v2(db);
}

// A database as the first release left it: migration 1 exactly, then one running job with
// its allocation, holds and an event, and a node, written the way version 1 wrote them.
void write_version_one_database(const std::string& path) {
  RawDb raw(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  ASSERT_EQ(sqlite_migrations()[0].version, 1);
  raw.exec("BEGIN");
  raw.exec(std::string(sqlite_migrations()[0].sql));
  raw.exec(
      "INSERT INTO jobs (id, user, name, spec_yaml, state, reason, attempt, submitted_at, started_at, "
      "ended_at, "
      "allocation, nccl_id, failed_rank, failed_node, exit_code) VALUES (3, 'ada', 'train', 'name: train\n', "
      "'RUNNING', '', 1, 1700000000123, 1700000000456, NULL, "
      "'{\"nodes\":[{\"node\":\"gpu-a\",\"gpus\":[0,1]}],\"master_addr\":\"10.0.0.1\",\"master_port\":29500}'"
      ", "
      "'" +
      std::string(256, 'f') + "', NULL, '', NULL)");
  raw.exec("INSERT INTO gpu_holds (node, gpu_index, job_id) VALUES ('gpu-a', 0, 3), ('gpu-a', 1, 3)");
  raw.exec("INSERT INTO port_holds (host, port, job_id) VALUES ('10.0.0.1', 29500, 3)");
  raw.exec("INSERT INTO job_events (job_id, at, text) VALUES (3, 5, 'PENDING -> RUNNING')");
  raw.exec("PRAGMA user_version = 1");
  raw.exec("COMMIT");
}

TEST(SqliteStore, VersionOneDatabaseIsMigratedKeepingItsJobs) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  ASSERT_NO_FATAL_FAILURE(write_version_one_database(path));
  ASSERT_EQ(RawDb(path).text("PRAGMA user_version"), "1");

  auto store = open_ok(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->pragma("user_version").value(), std::to_string(latest_sqlite_schema_version()));
  EXPECT_EQ(store->job(3).value(), running_job(3));  // ranks empty, every other field as written
  EXPECT_EQ(store->events(3).value(), (std::vector<JobEvent>{{3, from_millis(5), "PENDING -> RUNNING"}}));
  auto snap = store->load();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->active_jobs, std::vector<JobRecord>{running_job(3)});
  EXPECT_EQ(snap->max_job_id, 3);
  // Its holds survived: job 4 cannot take job 3's GPUs.
  JobRecord other = running_job(4);
  other.allocation->master_port = 29501;
  auto taken = store->commit(Change{{InsertJob{other}}});
  ASSERT_FALSE(taken.has_value());
  EXPECT_THAT(taken.error().message(), HasSubstr("held by job 3"));

  // The new column and table work on the migrated file.
  JobRecord with_ranks = running_job(3);
  with_ranks.ranks = {{0, "gpu-a", 0, {0}, {"GPU-0"}, 4242, model::RankState::Running, std::nullopt, std::nullopt}};
  ASSERT_TRUE(store->commit(Change{{UpdateJob{with_ranks}}}).has_value());
  User ada{"ada", std::string(64, 'a'), true};
  ASSERT_TRUE(store->commit(Change{{UpsertUser{ada}}}).has_value());
  store.reset();

  store = open_ok(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->job(3).value(), with_ranks);
  EXPECT_EQ(store->user_by_token_hash(ada.token_hash).value(), ada);
  EXPECT_EQ(store->users().value(), std::vector<User>{ada});
}

TEST(SqliteStore, MigratedJobsTableDefaultsRanksToAnEmptyList) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  ASSERT_NO_FATAL_FAILURE(write_version_one_database(path));
  ASSERT_NE(open_ok(path), nullptr);
  RawDb raw(path);
  EXPECT_EQ(raw.text("SELECT ranks FROM jobs WHERE id = 3"), "[]");
  EXPECT_EQ(raw.text("SELECT \"notnull\" FROM pragma_table_info('jobs') WHERE name = 'ranks'"), "1");
}

TEST(SqliteStore, DamagedRanksColumnIsInternalNamingTheJob) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  auto store = open_ok(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->commit(Change{{InsertJob{running_job(3)}}}).has_value());
  for (const std::string& ranks :
       {std::string("not json"), std::string("{}"), std::string("[{\"rank\": 0}]"), std::string("[7]")}) {
    SCOPED_TRACE(ranks);
    RawDb(path).exec("UPDATE jobs SET ranks = '" + ranks + "' WHERE id = 3");
    auto job = store->job(3);
    ASSERT_FALSE(job.has_value());
    EXPECT_EQ(job.error().code(), ErrorCode::Internal);
    EXPECT_THAT(job.error().message(), HasSubstr("job 3: ranks"));
  }
}

TEST(SqliteStore, UsersTableIsStrictAndKeepsTokenHashesUniqueEvenBypassingTheStore) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  {
    auto store = open_ok(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit(Change{{UpsertUser{{"alice", std::string(64, 'a'), false}}}}).has_value());
  }
  RawDb raw(path);
  EXPECT_EQ(raw.try_exec("INSERT INTO users (name, token_hash, admin) VALUES ('bob', '" +
                         std::string(64, 'a') + "', 0)"),
            SQLITE_CONSTRAINT_UNIQUE);
  EXPECT_EQ(raw.try_exec("INSERT INTO users (name, token_hash, admin) VALUES ('carol', 'x', 'yes')"),
            SQLITE_CONSTRAINT_DATATYPE);
  EXPECT_EQ(raw.text("SELECT count(*) FROM users"), "1");
}

TEST(SqliteStore, UserLookupByTokenHashUsesTheUniqueIndex) {
  testing::TempDir dir;
  std::string path = dir.file("corral.db");
  ASSERT_NE(open_ok(path), nullptr);
  // Column 3 of EXPLAIN QUERY PLAN is the plan step, e.g. "SEARCH users USING INDEX ...".
  std::string plan = RawDb(path).text(
      "EXPLAIN QUERY PLAN SELECT name, token_hash, admin FROM users WHERE token_hash = 'x'", 3);
  EXPECT_THAT(plan, HasSubstr("SEARCH users USING INDEX"));
  EXPECT_THAT(plan, HasSubstr("token_hash=?"));
}

}  // namespace
}  // namespace corral::store
