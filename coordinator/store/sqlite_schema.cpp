#include "coordinator/store/sqlite_schema.hpp"

#include <charconv>
#include <string>

namespace corral::store {

namespace {

// STRICT tables: SQLite refuses a value of the wrong type instead of storing it.
// Timestamps are integer milliseconds since the Unix epoch; JSON columns are TEXT.
constexpr std::string_view kMigration1 = R"sql(
CREATE TABLE jobs (
  id           INTEGER PRIMARY KEY CHECK (id > 0),
  user         TEXT    NOT NULL,
  name         TEXT    NOT NULL,
  spec_yaml    TEXT    NOT NULL,
  state        TEXT    NOT NULL,
  reason       TEXT    NOT NULL,
  attempt      INTEGER NOT NULL,
  submitted_at INTEGER NOT NULL,
  started_at   INTEGER,
  ended_at     INTEGER,
  allocation   TEXT,
  nccl_id      TEXT    NOT NULL,
  failed_rank  INTEGER,
  failed_node  TEXT    NOT NULL,
  exit_code    INTEGER
) STRICT;
CREATE INDEX jobs_by_state ON jobs (state);
CREATE INDEX jobs_by_user ON jobs (user, id);

CREATE TABLE job_events (
  seq    INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id INTEGER NOT NULL REFERENCES jobs (id),
  at     INTEGER NOT NULL,
  text   TEXT    NOT NULL
) STRICT;
CREATE INDEX job_events_by_job ON job_events (job_id, seq);

CREATE TABLE nodes (
  name       TEXT    PRIMARY KEY NOT NULL,
  address    TEXT    NOT NULL,
  state      TEXT    NOT NULL,
  reason     TEXT    NOT NULL,
  simulated  INTEGER NOT NULL,
  port_first INTEGER NOT NULL,
  port_last  INTEGER NOT NULL,
  gpus       TEXT    NOT NULL
) STRICT;

-- The primary keys are the point of these two tables: a GPU, or a port on a host
-- address, held by two live jobs cannot be written, whatever the code above does.
CREATE TABLE gpu_holds (
  node      TEXT    NOT NULL,
  gpu_index INTEGER NOT NULL,
  job_id    INTEGER NOT NULL REFERENCES jobs (id),
  PRIMARY KEY (node, gpu_index)
) STRICT, WITHOUT ROWID;
CREATE INDEX gpu_holds_by_job ON gpu_holds (job_id);

CREATE TABLE port_holds (
  host   TEXT    NOT NULL,
  port   INTEGER NOT NULL,
  job_id INTEGER NOT NULL REFERENCES jobs (id),
  PRIMARY KEY (host, port)
) STRICT, WITHOUT ROWID;
CREATE INDEX port_holds_by_job ON port_holds (job_id);
)sql";

// Version 2: each job's ranks (JSON list, the current attempt's), and the users who may
// call the API, with their tokens stored only as SHA-256 hashes.
constexpr std::string_view kMigration2 = R"sql(
ALTER TABLE jobs ADD COLUMN ranks TEXT NOT NULL DEFAULT '[]';

CREATE TABLE users (
  name       TEXT    PRIMARY KEY NOT NULL,
  token_hash TEXT    NOT NULL UNIQUE,
  admin      INTEGER NOT NULL
) STRICT;
)sql";

// Version 3: the ENDING state's outcome (the state a job moves to once every rank is
// confirmed gone; empty otherwise), and fences: what an earlier attempt still holds on
// nodes that went down before confirming (JSON list). Ranks gain "gone" in their JSON.
constexpr std::string_view kMigration3 = R"sql(
ALTER TABLE jobs ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN fences TEXT NOT NULL DEFAULT '[]';
)sql";

// Version 4: why a job ended, in words; and where each job was submitted from and the
// environment exported with it, written once at submission (a table of its own: the jobs
// row is rewritten on every rank report, and an environment may be 128 KiB).
constexpr std::string_view kMigration4 = R"sql(
ALTER TABLE jobs ADD COLUMN detail TEXT NOT NULL DEFAULT '';
CREATE TABLE job_submissions (
  job_id INTEGER PRIMARY KEY REFERENCES jobs (id),
  dir    TEXT    NOT NULL,
  env    TEXT    NOT NULL
) STRICT;
)sql";

// Version 5: history and accounting read ended jobs by end time.
constexpr std::string_view kMigration5 = R"sql(
CREATE INDEX jobs_by_end ON jobs (ended_at, id) WHERE ended_at IS NOT NULL;
)sql";

// Version 6: job arrays: each element's array (the first element's id) and index.
constexpr std::string_view kMigration6 = R"sql(
ALTER TABLE jobs ADD COLUMN array_job INTEGER;
ALTER TABLE jobs ADD COLUMN array_index INTEGER;
)sql";

// Version 7: the cluster's identity, written by `corral-coordinator init` (or adopted by
// the first start of a database made before identities), one row.
constexpr std::string_view kMigration7 = R"sql(
CREATE TABLE cluster (
  id       INTEGER PRIMARY KEY CHECK (id = 1),
  identity TEXT    NOT NULL CHECK (length(identity) BETWEEN 1 AND 128)
) STRICT;
)sql";

// Version 8: submit keys (Idempotency-Key), each written in the transaction of the jobs
// it made, so that a retried submission finds them after any crash; pruned by age.
constexpr std::string_view kMigration8 = R"sql(
CREATE TABLE submit_keys (
  user   TEXT    NOT NULL,
  key    TEXT    NOT NULL,
  job_id INTEGER NOT NULL REFERENCES jobs (id),
  jobs   INTEGER NOT NULL CHECK (jobs >= 1),
  at     INTEGER NOT NULL,
  PRIMARY KEY (user, key)
) STRICT;
CREATE INDEX submit_keys_by_at ON submit_keys (at);
)sql";

constexpr SqliteMigration kMigrations[] = {
    {1, kMigration1},
    {2, kMigration2},
    {3, kMigration3},
    {4, kMigration4},
    {5, kMigration5},
    {6, kMigration6},
    {7, kMigration7},
    {8, kMigration8},
};

Result<int> read_user_version(SqliteConnection& db) {
  auto text = db.query_text("PRAGMA user_version");
  if (!text) return std::unexpected(text.error().with_context("read schema version"));
  int version = 0;
  auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), version);
  if (ec != std::errc() || ptr != text->data() + text->size()) {
    return make_error(ErrorCode::Internal, "read schema version: unexpected user_version \"" + *text + "\"");
  }
  return version;
}

Result<void> apply(SqliteConnection& db, const SqliteMigration& migration) {
  // user_version is read again inside the write lock: another process may have migrated
  // between our first look and now.
  if (auto ok = db.exec("BEGIN IMMEDIATE"); !ok) return ok;
  auto rollback_with = [&](const Error& err) -> Result<void> {
    if (db.in_transaction()) (void)db.exec("ROLLBACK");
    return std::unexpected(
        err.with_context("migrate schema to version " + std::to_string(migration.version)));
  };
  auto current = read_user_version(db);
  if (!current) return rollback_with(current.error());
  if (*current >= migration.version) return db.exec("COMMIT");
  if (*current != migration.version - 1) {
    return rollback_with(Error(ErrorCode::Internal, "database is at version " + std::to_string(*current)));
  }
  if (auto ok = db.exec(migration.sql); !ok) return rollback_with(ok.error());
  if (auto ok = db.exec("PRAGMA user_version = " + std::to_string(migration.version)); !ok) {
    return rollback_with(ok.error());
  }
  if (auto ok = db.exec("COMMIT"); !ok) return rollback_with(ok.error());
  return {};
}

}  // namespace

std::span<const SqliteMigration> sqlite_migrations() {
  return kMigrations;
}

int latest_sqlite_schema_version() {
  return kMigrations[std::size(kMigrations) - 1].version;
}

Result<void> migrate_sqlite_schema(SqliteConnection& db) {
  auto version = read_user_version(db);
  if (!version) return std::unexpected(version.error());
  if (*version > latest_sqlite_schema_version()) {
    return make_error(ErrorCode::Conflict, "database schema version " + std::to_string(*version) +
                                               " is newer than this build of corral supports (" +
                                               std::to_string(latest_sqlite_schema_version()) +
                                               "); run a newer corral-coordinator or restore a backup");
  }
  for (const auto& migration : kMigrations) {
    if (migration.version <= *version) continue;
    if (auto ok = apply(db, migration); !ok) return ok;
  }
  return {};
}

}  // namespace corral::store
