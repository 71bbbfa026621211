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
  explicit RawDb(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "sqlite3_open_v2 " << path << ": " << sqlite3_errmsg(db_);
    }
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << (err != nullptr ? err : "?");
    }
    sqlite3_free(err);
  }
  std::string text(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    std::string out;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
      return out;
    }
    if (sqlite3_step(stmt) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
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
                     "('jobs', 'job_events', 'nodes', 'gpu_holds', 'port_holds')"),
            "5");
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

}  // namespace
}  // namespace corral::store

namespace corral::store {
namespace {

TEST(SqliteStore, AVersionOneDatabaseIsMigratedKeepingItsJobs) {
  testing::TempDir dir;
  std::string path = dir.file("v1.db");
  {
    // A database as the first release wrote it: migration 1 only, one job in it.
    std::ofstream(path).flush();  // an empty file is an empty database to SQLite
    RawDb raw(path);
    raw.exec(std::string(sqlite_migrations()[0].sql));
    raw.exec("PRAGMA user_version = 1");
    raw.exec("INSERT INTO jobs (id, user, name, spec_yaml, state, reason, attempt, submitted_at, nccl_id, "
             "failed_node) VALUES (3, 'ada', 'old', 'name: old', 'PENDING', '', 0, 1000, '', '')");
  }
  auto store = open_ok(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->pragma("user_version").value(), "2");
  auto job = store->job(3);
  ASSERT_TRUE(job.has_value() && job->has_value());
  EXPECT_EQ((*job)->name, "old");
  EXPECT_TRUE((*job)->ranks.empty());
  ASSERT_TRUE(store->commit(Change{{UpsertUser{{"ada", std::string(64, 'a'), true}}}}).has_value());
  EXPECT_EQ(store->users()->size(), 1u);
}

}  // namespace
}  // namespace corral::store
