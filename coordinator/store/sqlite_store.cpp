#include "coordinator/store/sqlite_store.hpp"

#include <algorithm>

#include <sqlite3.h>

#include "coordinator/store/json_columns.hpp"
#include "coordinator/store/sqlite_connection.hpp"
#include "coordinator/store/sqlite_schema.hpp"
#include "coordinator/store/store_rules.hpp"

namespace corral::store {

namespace {

// Column order of every job SELECT and of the ?1..?19 parameters of INSERT and UPDATE.
constexpr std::string_view kSelectJob =
    "SELECT id, user, name, spec_yaml, state, reason, attempt, submitted_at, started_at, ended_at, "
    "allocation, nccl_id, failed_rank, failed_node, exit_code, ranks, outcome, fences, detail, s.dir, s.env, "
    "array_job, array_index FROM jobs LEFT JOIN job_submissions s ON s.job_id = jobs.id ";
constexpr std::string_view kInsertSubmission = "INSERT INTO job_submissions (job_id, dir, env) VALUES (?1, ?2, ?3)";
constexpr std::string_view kInsertJob =
    "INSERT INTO jobs (id, user, name, spec_yaml, state, reason, attempt, submitted_at, started_at, "
    "ended_at, allocation, nccl_id, failed_rank, failed_node, exit_code, ranks, outcome, fences, detail, "
    "array_job, array_index) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)";
constexpr std::string_view kUpdateJob =
    "UPDATE jobs SET user = ?2, name = ?3, spec_yaml = ?4, state = ?5, reason = ?6, attempt = ?7, "
    "submitted_at = ?8, started_at = ?9, ended_at = ?10, allocation = ?11, nccl_id = ?12, failed_rank = ?13, "
    "failed_node = ?14, exit_code = ?15, ranks = ?16, outcome = ?17, fences = ?18, detail = ?19, array_job = ?20, "
    "array_index = ?21 WHERE id = ?1";
constexpr std::string_view kUpsertNode =
    "INSERT INTO nodes (name, address, state, reason, simulated, port_first, port_last, gpus) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) "
    "ON CONFLICT (name) DO UPDATE SET address = excluded.address, state = excluded.state, "
    "reason = excluded.reason, simulated = excluded.simulated, port_first = excluded.port_first, "
    "port_last = excluded.port_last, gpus = excluded.gpus";
constexpr std::string_view kSelectUser = "SELECT name, token_hash, admin FROM users ";
constexpr std::string_view kUpsertUser =
    "INSERT INTO users (name, token_hash, admin) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, admin = excluded.admin";

// "'PENDING', 'STARTING', 'RUNNING'", derived from the model so that a new state cannot be
// forgotten here.
std::string active_states_sql() {
  std::string out;
  for (model::JobState s : model::kAllJobStates) {
    if (model::is_terminal(s)) continue;
    if (!out.empty()) out += ", ";
    out += "'";
    out += model::to_string(s);
    out += "'";
  }
  return out;
}

const std::string& select_all_jobs_sql() {
  static const std::string sql = std::string(kSelectJob) + "WHERE (?1 IS NULL OR user = ?1) ORDER BY id";
  return sql;
}

const std::string& select_active_jobs_sql() {
  static const std::string sql = std::string(kSelectJob) + "WHERE (state IN (" + active_states_sql() +
                                 ") OR fences <> '[]') AND (?1 IS NULL OR user = ?1) ORDER BY id";
  return sql;
}

std::optional<std::int64_t> optional_millis(const std::optional<TimePoint>& t) {
  if (!t) return std::nullopt;
  return to_millis(*t);
}

std::optional<std::int64_t> optional_int(const std::optional<int>& v) {
  if (!v) return std::nullopt;
  return *v;
}

void bind_job(SqliteStatement& stmt, const JobRecord& job) {
  std::optional<std::string> allocation;
  if (job.allocation) allocation = allocation_to_json(*job.allocation);
  stmt.bind(1, job.id)
      .bind(2, job.user)
      .bind(3, job.name)
      .bind(4, job.spec_yaml)
      .bind(5, model::to_string(job.state))
      .bind(6, job.reason)
      .bind(7, std::int64_t{job.attempt})
      .bind(8, to_millis(job.submitted_at))
      .bind(9, optional_millis(job.started_at))
      .bind(10, optional_millis(job.ended_at))
      .bind(11, allocation)
      .bind(12, job.nccl_id)
      .bind(13, optional_int(job.failed_rank))
      .bind(14, job.failed_node)
      .bind(15, optional_int(job.exit_code))
      .bind(16, ranks_to_json(job.ranks))
      .bind(17, job.outcome ? std::string(model::to_string(*job.outcome)) : std::string())
      .bind(18, fences_to_json(job.fences))
      .bind(19, job.detail)
      .bind(20, job.array ? std::optional<std::int64_t>(job.array->job) : std::nullopt)
      .bind(21, job.array ? std::optional<std::int64_t>(job.array->index) : std::nullopt);
}

// Values we wrote ourselves; a mismatch means the file was damaged or edited by hand.
Result<JobRecord> read_job(const SqliteStatement& stmt) {
  JobRecord job;
  job.id = stmt.int64(0);
  auto context = [&](std::string_view what) {
    return "job " + std::to_string(job.id) + ": " + std::string(what);
  };
  job.user = stmt.text(1);
  job.name = stmt.text(2);
  job.spec_yaml = stmt.text(3);
  std::string state = stmt.text(4);
  auto parsed = model::parse_job_state(state);
  if (!parsed) {
    return make_error(ErrorCode::Internal, context("unknown state \"" + state + "\" in the database"));
  }
  job.state = *parsed;
  job.reason = stmt.text(5);
  job.attempt = static_cast<int>(stmt.int64(6));
  job.submitted_at = from_millis(stmt.int64(7));
  if (auto t = stmt.optional_int64(8)) job.started_at = from_millis(*t);
  if (auto t = stmt.optional_int64(9)) job.ended_at = from_millis(*t);
  if (auto text = stmt.optional_text(10)) {
    auto alloc = allocation_from_json(*text);
    if (!alloc) return make_error(ErrorCode::Internal, context(alloc.error().message()));
    job.allocation = std::move(*alloc);
  }
  job.nccl_id = stmt.text(11);
  if (auto v = stmt.optional_int64(12)) job.failed_rank = static_cast<int>(*v);
  job.failed_node = stmt.text(13);
  if (auto v = stmt.optional_int64(14)) job.exit_code = static_cast<int>(*v);
  auto ranks = ranks_from_json(stmt.text(15));
  if (!ranks) return make_error(ErrorCode::Internal, context(ranks.error().message()));
  job.ranks = std::move(*ranks);
  if (std::string outcome = stmt.text(16); !outcome.empty()) {
    auto o = model::parse_job_state(outcome);
    if (!o) return make_error(ErrorCode::Internal, context("unknown outcome \"" + outcome + "\" in the database"));
    job.outcome = *o;
  }
  auto fences = fences_from_json(stmt.text(17));
  if (!fences) return make_error(ErrorCode::Internal, context(fences.error().message()));
  job.fences = std::move(*fences);
  job.detail = stmt.text(18);
  if (auto dir = stmt.optional_text(19)) job.submission.dir = *dir;
  if (auto env = stmt.optional_text(20)) {
    auto exported = env_from_json(*env);
    if (!exported) return make_error(ErrorCode::Internal, context(exported.error().message()));
    job.submission.env = std::move(*exported);
  }
  if (auto array_job = stmt.optional_int64(21)) {
    job.array = ArrayElement{*array_job, static_cast<int>(stmt.optional_int64(22).value_or(0))};
  }
  return job;
}

Result<model::Node> read_node(const SqliteStatement& stmt) {
  model::Node node;
  node.name = stmt.text(0);
  node.address = stmt.text(1);
  std::string state = stmt.text(2);
  auto parsed = model::parse_node_state(state);
  if (!parsed) {
    return make_error(ErrorCode::Internal,
                      "node " + node.name + ": unknown state \"" + state + "\" in the database");
  }
  node.state = *parsed;
  node.reason = stmt.text(3);
  node.simulated = stmt.int64(4) != 0;
  node.ports.first = static_cast<int>(stmt.int64(5));
  node.ports.last = static_cast<int>(stmt.int64(6));
  auto gpus = gpus_from_json(stmt.text(7));
  if (!gpus) return make_error(ErrorCode::Internal, "node " + node.name + ": " + gpus.error().message());
  node.gpus = std::move(*gpus);
  return node;
}

User read_user(const SqliteStatement& stmt) {
  return User{stmt.text(0), stmt.text(1), stmt.int64(2) != 0};
}

}  // namespace

SqliteStore::SqliteStore(std::unique_ptr<SqliteConnection> db) : db_(std::move(db)) {}

SqliteStore::~SqliteStore() = default;

const std::string& SqliteStore::path() const {
  return db_->path();
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::open(const std::string& path, Options options) {
  auto fail = [&](const Error& e) -> Result<std::unique_ptr<SqliteStore>> {
    return std::unexpected(e.with_context("open store " + path));
  };
  auto conn = SqliteConnection::open(path);
  if (!conn) return fail(conn.error());
  SqliteConnection& db = **conn;
  if (auto ok = db.set_busy_timeout(static_cast<int>(options.busy_timeout.count())); !ok) {
    return fail(ok.error());
  }
  // The first statement reads the file header: this is where "not a database" shows up.
  auto mode = db.query_text("PRAGMA journal_mode = WAL");
  if (!mode) return fail(mode.error());
  if (*mode != "wal" && !(path == ":memory:" && *mode == "memory")) {
    return fail(
        Error(ErrorCode::Unavailable, "could not switch to WAL mode, journal_mode is \"" + *mode + "\""));
  }
  // FULL, not NORMAL: in WAL mode NORMAL may lose the last commits on power loss, and an
  // acknowledged state change must survive that.
  if (auto ok = db.exec("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON"); !ok) return fail(ok.error());
  auto sync = db.query_text("PRAGMA synchronous");
  if (!sync) return fail(sync.error());
  auto fk = db.query_text("PRAGMA foreign_keys");
  if (!fk) return fail(fk.error());
  if (*sync != "2" || *fk != "1") {
    return fail(Error(ErrorCode::Internal,
                      "PRAGMA synchronous/foreign_keys did not take effect (" + *sync + ", " + *fk + ")"));
  }
  if (auto ok = migrate_sqlite_schema(db); !ok) return fail(ok.error());
  if (options.query_only) {
    if (auto ok = db.exec("PRAGMA query_only = ON"); !ok) return fail(ok.error());
  }
  return std::unique_ptr<SqliteStore>(new SqliteStore(std::move(*conn)));
}

Result<std::string> SqliteStore::pragma(std::string_view name) {
  bool valid = !name.empty() && std::all_of(name.begin(), name.end(),
                                            [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
  if (!valid) {
    return make_error(ErrorCode::InvalidArgument, "not a pragma name: \"" + std::string(name) + "\"");
  }
  return db_->query_text("PRAGMA " + std::string(name));
}

// ---- writes ----

std::vector<Result<void>> SqliteStore::commit(std::span<const Change> changes) {
  std::vector<Result<void>> results;
  if (changes.empty()) return results;
  auto fail_all = [&](const Error& e) {
    results.assign(changes.size(), std::unexpected(e));
    return results;
  };
  // IMMEDIATE takes the write lock now, so no change can fail half-way with SQLITE_BUSY
  // because another connection started writing first.
  if (auto ok = db_->run("BEGIN IMMEDIATE"); !ok) return fail_all(ok.error().with_context("commit: begin"));
  results.reserve(changes.size());
  for (const Change& change : changes) {
    auto ok = apply_change(change);
    if (!db_->in_transaction()) {
      // SQLite rolled the whole transaction back (disk full, I/O error): the changes
      // applied so far are gone too, and nothing more can be applied.
      Error cause = ok ? Error(ErrorCode::Internal, "transaction ended unexpectedly") : ok.error();
      return fail_all(cause.with_context("commit: batch rolled back"));
    }
    results.push_back(std::move(ok));
  }
  if (auto ok = db_->run("COMMIT"); !ok) {
    if (db_->in_transaction()) (void)db_->run("ROLLBACK");
    return fail_all(ok.error().with_context("commit"));
  }
  return results;
}

Result<void> SqliteStore::apply_change(const Change& change) {
  if (auto ok = db_->run("SAVEPOINT change"); !ok) return ok;
  for (const Mutation& mutation : change.mutations) {
    auto ok = std::visit([this](const auto& m) { return apply(m); }, mutation);
    if (ok) continue;
    if (!db_->in_transaction()) return ok;  // commit() reports the whole batch
    if (cannot_write(ok.error())) {
      // The file, not this change, is at fault: no change of the batch is kept, so the
      // caller can hold the batch whole and write it again once the store can.
      (void)db_->run("ROLLBACK");
      return ok;
    }
    auto undone = db_->run("ROLLBACK TO change");
    if (!undone) {
      // The change cannot be undone alone, so nothing of the batch may be kept.
      (void)db_->run("ROLLBACK");
      return std::unexpected(
          undone.error().with_context("undo failed change (" + ok.error().to_string() + ")"));
    }
    if (auto released = db_->run("RELEASE change"); !released) {
      (void)db_->run("ROLLBACK");
      return std::unexpected(released.error().with_context("undo failed change"));
    }
    return ok;
  }
  if (auto released = db_->run("RELEASE change"); !released) {
    // Left in place, the savepoint would be committed with the batch although this change
    // reports failure: drop the whole batch instead, which commit() then reports.
    (void)db_->run("ROLLBACK");
    return released;
  }
  return {};
}

Result<void> SqliteStore::apply(const InsertJob& m) {
  const JobRecord& job = m.job;
  if (auto ok = check_job_record(job); !ok) return ok;
  auto stmt = db_->prepare(kInsertJob);
  if (!stmt) return std::unexpected(stmt.error());
  bind_job(**stmt, job);
  if (auto ok = (*stmt)->run(); !ok) {
    if ((*stmt)->extended_error_code() == SQLITE_CONSTRAINT_PRIMARYKEY) {
      return std::unexpected(job_exists_error(job.id));
    }
    return std::unexpected(ok.error().with_context("insert job " + std::to_string(job.id)));
  }
  if (!job.submission.dir.empty() || !job.submission.env.empty()) {
    auto sub = db_->prepare(kInsertSubmission);
    if (!sub) return std::unexpected(sub.error());
    (*sub)->bind(1, job.id).bind(2, job.submission.dir).bind(3, env_to_json(job.submission.env));
    if (auto ok = (*sub)->run(); !ok) {
      return std::unexpected(ok.error().with_context("insert job " + std::to_string(job.id)));
    }
  }
  return hold_resources(job);
}

Result<void> SqliteStore::apply(const UpdateJob& m) {
  const JobRecord& job = m.job;
  if (job.id <= 0) return std::unexpected(job_not_found_error(job.id, "update"));
  if (auto ok = check_job_record(job); !ok) return ok;
  {
    auto stmt = db_->prepare(kUpdateJob);
    if (!stmt) return std::unexpected(stmt.error());
    bind_job(**stmt, job);
    if (auto ok = (*stmt)->run(); !ok) {
      return std::unexpected(ok.error().with_context("update job " + std::to_string(job.id)));
    }
    if ((*stmt)->changes() == 0) return std::unexpected(job_not_found_error(job.id, "update"));
  }
  return hold_resources(job);
}

// Replaces whatever the job held with what its new record holds: nothing unless the state
// holds resources. The primary keys of the hold tables do the conflict detection.
Result<void> SqliteStore::hold_resources(const JobRecord& job) {
  auto context = "hold resources for job " + std::to_string(job.id);
  for (std::string_view sql :
       {"DELETE FROM gpu_holds WHERE job_id = ?1", "DELETE FROM port_holds WHERE job_id = ?1"}) {
    auto stmt = db_->prepare(sql);
    if (!stmt) return std::unexpected(stmt.error());
    (*stmt)->bind(1, job.id);
    if (auto ok = (*stmt)->run(); !ok) return std::unexpected(ok.error().with_context(context));
  }
  for (const GpuKey& gpu : gpus_held_by(job)) {
    auto stmt = db_->prepare("INSERT INTO gpu_holds (node, gpu_index, job_id) VALUES (?1, ?2, ?3)");
    if (!stmt) return std::unexpected(stmt.error());
    (*stmt)->bind(1, gpu.node).bind(2, std::int64_t{gpu.index}).bind(3, job.id);
    auto ok = (*stmt)->run();
    if (ok) continue;
    if ((*stmt)->extended_error_code() != SQLITE_CONSTRAINT_PRIMARYKEY) {
      return std::unexpected(ok.error().with_context(context));
    }
    stmt->reset();
    auto holder = db_->prepare("SELECT job_id FROM gpu_holds WHERE node = ?1 AND gpu_index = ?2");
    if (!holder) return std::unexpected(holder.error());
    (*holder)->bind(1, gpu.node).bind(2, std::int64_t{gpu.index});
    auto row = (*holder)->step();
    if (!row) return std::unexpected(row.error().with_context(context));
    return std::unexpected(gpu_held_error(gpu, *row ? (*holder)->int64(0) : 0, job.id));
  }
  for (const PortKey& held : ports_held_by(job)) {
    const PortKey* port = &held;
    auto stmt = db_->prepare("INSERT INTO port_holds (host, port, job_id) VALUES (?1, ?2, ?3)");
    if (!stmt) return std::unexpected(stmt.error());
    (*stmt)->bind(1, port->host).bind(2, std::int64_t{port->port}).bind(3, job.id);
    auto ok = (*stmt)->run();
    if (ok) continue;
    if ((*stmt)->extended_error_code() != SQLITE_CONSTRAINT_PRIMARYKEY) {
      return std::unexpected(ok.error().with_context(context));
    }
    stmt->reset();
    auto holder = db_->prepare("SELECT job_id FROM port_holds WHERE host = ?1 AND port = ?2");
    if (!holder) return std::unexpected(holder.error());
    (*holder)->bind(1, port->host).bind(2, std::int64_t{port->port});
    auto row = (*holder)->step();
    if (!row) return std::unexpected(row.error().with_context(context));
    return std::unexpected(port_held_error(*port, *row ? (*holder)->int64(0) : 0, job.id));
  }
  return {};
}

Result<void> SqliteStore::apply(const AppendEvent& m) {
  const JobEvent& event = m.event;
  auto stmt = db_->prepare("INSERT INTO job_events (job_id, at, text) VALUES (?1, ?2, ?3)");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, event.job).bind(2, to_millis(event.at)).bind(3, event.text);
  if (auto ok = (*stmt)->run(); !ok) {
    if ((*stmt)->extended_error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
      return std::unexpected(job_not_found_error(event.job, "append event"));
    }
    return std::unexpected(ok.error().with_context("append event to job " + std::to_string(event.job)));
  }
  return {};
}

Result<void> SqliteStore::apply(const UpsertNode& m) {
  const model::Node& node = m.node;
  auto stmt = db_->prepare(kUpsertNode);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)
      ->bind(1, node.name)
      .bind(2, node.address)
      .bind(3, model::to_string(node.state))
      .bind(4, node.reason)
      .bind(5, std::int64_t{node.simulated ? 1 : 0})
      .bind(6, std::int64_t{node.ports.first})
      .bind(7, std::int64_t{node.ports.last})
      .bind(8, gpus_to_json(node.gpus));
  if (auto ok = (*stmt)->run(); !ok) {
    return std::unexpected(ok.error().with_context("upsert node " + node.name));
  }
  return {};
}

Result<void> SqliteStore::apply(const UpsertUser& m) {
  const User& user = m.user;
  if (auto ok = check_user(user); !ok) return ok;
  auto context = "upsert user " + user.name;
  {
    // Looked for first rather than left to the UNIQUE constraint, so the Conflict can
    // name who holds the token.
    auto holder = db_->prepare("SELECT name FROM users WHERE token_hash = ?1 AND name <> ?2");
    if (!holder) return std::unexpected(holder.error());
    (*holder)->bind(1, user.token_hash).bind(2, user.name);
    auto row = (*holder)->step();
    if (!row) return std::unexpected(row.error().with_context(context));
    if (*row) return std::unexpected(token_taken_error((*holder)->text(0), user.name));
  }
  auto stmt = db_->prepare(kUpsertUser);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, user.name).bind(2, user.token_hash).bind(3, std::int64_t{user.admin ? 1 : 0});
  if (auto ok = (*stmt)->run(); !ok) return std::unexpected(ok.error().with_context(context));
  return {};
}

Result<void> SqliteStore::apply(const RecordSubmitKey& m) {
  const SubmitKey& key = m.key;
  if (auto ok = check_submit_key(key); !ok) return ok;
  auto stmt = db_->prepare("INSERT INTO submit_keys (user, key, job_id, jobs, at) VALUES (?1, ?2, ?3, ?4, ?5)");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)
      ->bind(1, key.user)
      .bind(2, key.key)
      .bind(3, key.job)
      .bind(4, std::int64_t{key.jobs})
      .bind(5, to_millis(key.at));
  if (auto ok = (*stmt)->run(); !ok) {
    if ((*stmt)->extended_error_code() == SQLITE_CONSTRAINT_PRIMARYKEY) {
      return std::unexpected(submit_key_exists_error(key));
    }
    if ((*stmt)->extended_error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
      return std::unexpected(job_not_found_error(key.job, "record submit key"));
    }
    return std::unexpected(ok.error().with_context("record submit key of user " + key.user));
  }
  return {};
}

Result<void> SqliteStore::apply(const PruneSubmitKeys& m) {
  // Through the index on `at`: a bounded delete, however many keys are old.
  auto stmt = db_->prepare(
      "DELETE FROM submit_keys WHERE rowid IN "
      "(SELECT rowid FROM submit_keys WHERE at < ?1 ORDER BY at LIMIT ?2)");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, to_millis(m.before)).bind(2, std::int64_t{std::max(m.limit, 0)});
  if (auto ok = (*stmt)->run(); !ok) return std::unexpected(ok.error().with_context("prune submit keys"));
  return {};
}

// ---- reads ----

Result<std::vector<JobRecord>> SqliteStore::select_jobs(std::string_view sql, const JobQuery& query) {
  auto stmt = db_->prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, query.user);
  std::vector<JobRecord> jobs;
  while (true) {
    auto row = (*stmt)->step();
    if (!row) return std::unexpected(row.error().with_context("read jobs"));
    if (!*row) return jobs;
    auto job = read_job(**stmt);
    if (!job) return std::unexpected(job.error());
    jobs.push_back(std::move(*job));
  }
}

Result<std::optional<JobRecord>> SqliteStore::job(model::JobId id) {
  static const std::string sql = std::string(kSelectJob) + "WHERE id = ?1";
  auto stmt = db_->prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, id);
  auto row = (*stmt)->step();
  if (!row) return std::unexpected(row.error().with_context("read job " + std::to_string(id)));
  if (!*row) return std::optional<JobRecord>();
  auto job = read_job(**stmt);
  if (!job) return std::unexpected(job.error());
  return std::optional<JobRecord>(std::move(*job));
}

Result<std::vector<JobRecord>> SqliteStore::jobs(const JobQuery& query) {
  return select_jobs(query.include_terminal ? select_all_jobs_sql() : select_active_jobs_sql(), query);
}

Result<std::optional<model::JobId>> SqliteStore::array_element(model::JobId array, int index) {
  // Elements' ids follow their array's, so this reads a short range of the primary key.
  auto stmt = db_->prepare("SELECT id FROM jobs WHERE id >= ?1 AND array_job = ?1 AND array_index = ?2 LIMIT 1");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, array);
  (*stmt)->bind(2, std::int64_t{index});
  auto row = (*stmt)->step();
  if (!row) return std::unexpected(row.error().with_context("find array element"));
  if (!*row) return std::optional<model::JobId>();
  return std::optional<model::JobId>((*stmt)->int64(0));
}

Result<std::vector<JobRecord>> SqliteStore::ended_jobs(const EndedQuery& query) {
  // The columns of kSelectJob, with what a history does not show left empty; the partial
  // index jobs_by_end makes this a range scan. Users and states are filtered here, so a
  // row that does not match is never decoded; they are bound as ?4 onwards.
  std::string sql =
      "SELECT id, user, name, '', state, reason, attempt, submitted_at, started_at, ended_at, allocation, nccl_id, "
      "failed_rank, failed_node, exit_code, '[]', outcome, '[]', detail, NULL, NULL, array_job, array_index FROM jobs "
      "WHERE ended_at IS NOT NULL AND ended_at >= ?1 AND (?2 IS NULL OR ended_at < ?2) AND state NOT IN (" +
      active_states_sql() + ")";
  int next = 4;
  auto in_list = [&](const char* column, std::size_t n) {
    if (n == 0) return;
    sql += std::string(" AND ") + column + " IN (";
    for (std::size_t i = 0; i < n; ++i) sql += (i == 0 ? "?" : ", ?") + std::to_string(next++);
    sql += ")";
  };
  in_list("user", query.users.size());
  in_list("state", query.states.size());
  sql += " ORDER BY ended_at, id LIMIT ?3";
  auto stmt = db_->prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, to_millis(query.since));
  (*stmt)->bind(2, optional_millis(query.until));
  (*stmt)->bind(3, query.limit == 0 ? std::int64_t{-1} : static_cast<std::int64_t>(query.limit));
  int at = 4;
  for (const auto& u : query.users) (*stmt)->bind(at++, u);
  for (auto st : query.states) (*stmt)->bind(at++, model::to_string(st));
  std::vector<JobRecord> jobs;
  while (true) {
    auto row = (*stmt)->step();
    if (!row) return std::unexpected(row.error().with_context("read ended jobs"));
    if (!*row) return jobs;
    auto job = read_job(**stmt);
    if (!job) return std::unexpected(job.error());
    jobs.push_back(std::move(*job));
  }
}

Result<std::vector<UsageRow>> SqliteStore::gpu_usage(const EndedQuery& query, UsageKey by) {
  if (!query.until) return make_error(ErrorCode::InvalidArgument, "gpu_usage needs an end of range");
  // One row per GPU of each allocation (json_each twice), its time clipped to the range;
  // a GPU's product comes from its node's stored inventory. Summed in SQLite: what
  // crosses into C++ is one row per key.
  // The query's users, if any, are bound as ?3 onwards.
  std::string users;
  for (std::size_t i = 0; i < query.users.size(); ++i) users += (i == 0 ? "?" : ", ?") + std::to_string(3 + i);
  const std::string base =
      "WITH j AS (SELECT id, user, allocation, MAX(started_at, ?1) AS f, MIN(ended_at, ?2) AS t FROM jobs "
      "  WHERE ended_at IS NOT NULL AND ended_at >= ?1 AND ended_at < ?2 AND started_at IS NOT NULL "
      "  AND allocation IS NOT NULL AND state NOT IN (" + active_states_sql() + ")" +
      (users.empty() ? std::string() : " AND user IN (" + users + ")") + "), "
      "g AS (SELECT j.id AS id, j.user AS user, json_extract(n.value, '$.node') AS node, "
      "  CAST(x.value AS INTEGER) AS gpu, j.t - j.f AS ms "
      "  FROM j, json_each(j.allocation, '$.nodes') AS n, json_each(n.value, '$.gpus') AS x WHERE j.t > j.f), "
      "c AS MATERIALIZED (SELECT nodes.name AS node, CAST(json_extract(y.value, '$.index') AS INTEGER) AS gpu, "
      "  json_extract(y.value, '$.product') AS product FROM nodes, json_each(nodes.gpus) AS y) ";
  const std::string key = by == UsageKey::User ? "g.user" : by == UsageKey::Node ? "g.node" : "COALESCE(c.product, 'unknown')";
  const std::string sql = base + "SELECT " + key + " AS k, SUM(g.ms), COUNT(DISTINCT g.id) FROM g " +
                          (by == UsageKey::Class ? "LEFT JOIN c ON c.node = g.node AND c.gpu = g.gpu " : "") +
                          "GROUP BY k ORDER BY k";
  auto stmt = db_->prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, to_millis(query.since));
  (*stmt)->bind(2, to_millis(*query.until));
  int at = 3;
  for (const auto& u : query.users) (*stmt)->bind(at++, u);
  std::vector<UsageRow> rows;
  while (true) {
    auto row = (*stmt)->step();
    if (!row) return std::unexpected(row.error().with_context("sum GPU time"));
    if (!*row) return rows;
    rows.push_back({(*stmt)->text(0), (*stmt)->int64(1), (*stmt)->int64(2)});
  }
}

Result<std::vector<JobEvent>> SqliteStore::events(model::JobId id) {
  auto stmt = db_->prepare("SELECT job_id, at, text FROM job_events WHERE job_id = ?1 ORDER BY seq");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, id);
  std::vector<JobEvent> events;
  while (true) {
    auto row = (*stmt)->step();
    if (!row) return std::unexpected(row.error().with_context("read events of job " + std::to_string(id)));
    if (!*row) return events;
    events.push_back({(*stmt)->int64(0), from_millis((*stmt)->int64(1)), (*stmt)->text(2)});
  }
}

Result<std::optional<SubmitKey>> SqliteStore::submit_key(const std::string& user, const std::string& key) {
  auto stmt = db_->prepare("SELECT job_id, jobs, at FROM submit_keys WHERE user = ?1 AND key = ?2");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, user).bind(2, key);
  auto row = (*stmt)->step();
  if (!row) return std::unexpected(row.error().with_context("read submit key of user " + user));
  if (!*row) return std::optional<SubmitKey>();
  return std::optional<SubmitKey>(SubmitKey{user, key, (*stmt)->int64(0), static_cast<int>((*stmt)->int64(1)),
                                            from_millis((*stmt)->int64(2))});
}

Result<Snapshot> SqliteStore::load() {
  // One read transaction, so the nodes, jobs and max id come from the same instant.
  if (auto ok = db_->run("BEGIN"); !ok) return std::unexpected(ok.error().with_context("load"));
  auto read = [&]() -> Result<Snapshot> {
    Snapshot snap;
    {
      auto stmt = db_->prepare(
          "SELECT name, address, state, reason, simulated, port_first, port_last, gpus FROM nodes ORDER BY "
          "name");
      if (!stmt) return std::unexpected(stmt.error());
      while (true) {
        auto row = (*stmt)->step();
        if (!row) return std::unexpected(row.error().with_context("read nodes"));
        if (!*row) break;
        auto node = read_node(**stmt);
        if (!node) return std::unexpected(node.error());
        snap.nodes.push_back(std::move(*node));
      }
    }
    auto active = select_jobs(select_active_jobs_sql(), JobQuery{});
    if (!active) return std::unexpected(active.error());
    snap.active_jobs = std::move(*active);
    auto stmt = db_->prepare("SELECT COALESCE(MAX(id), 0) FROM jobs");
    if (!stmt) return std::unexpected(stmt.error());
    auto row = (*stmt)->step();
    if (!row) return std::unexpected(row.error().with_context("read max job id"));
    snap.max_job_id = (*stmt)->int64(0);
    return snap;
  };
  auto snap = read();
  // A read transaction has nothing to lose; COMMIT and ROLLBACK both just end it.
  auto ended = db_->run(snap ? "COMMIT" : "ROLLBACK");
  if (!snap) return std::unexpected(snap.error().with_context("load"));
  if (!ended) return std::unexpected(ended.error().with_context("load"));
  return snap;
}

Result<std::optional<User>> SqliteStore::user_by_token_hash(const std::string& token_hash) {
  // token_hash is UNIQUE, so this is a lookup in its index, not a scan.
  static const std::string sql = std::string(kSelectUser) + "WHERE token_hash = ?1";
  auto stmt = db_->prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, token_hash);
  auto row = (*stmt)->step();
  if (!row) return std::unexpected(row.error().with_context("read user by token"));
  if (!*row) return std::optional<User>();
  return std::optional<User>(read_user(**stmt));
}

Result<std::vector<User>> SqliteStore::users() {
  static const std::string sql = std::string(kSelectUser) + "ORDER BY name";
  auto stmt = db_->prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  std::vector<User> users;
  while (true) {
    auto row = (*stmt)->step();
    if (!row) return std::unexpected(row.error().with_context("read users"));
    if (!*row) return users;
    users.push_back(read_user(**stmt));
  }
}

// ---- the cluster's identity ----

Result<std::optional<std::string>> SqliteStore::cluster_identity() {
  auto text = db_->query_text("SELECT identity FROM cluster WHERE id = 1");
  if (!text) return std::unexpected(text.error().with_context("read the cluster identity"));
  if (text->empty()) return std::nullopt;
  return *text;
}

Result<void> SqliteStore::set_cluster_identity(std::string_view identity) {
  auto stmt = db_->prepare("INSERT INTO cluster (id, identity) VALUES (1, ?1)");
  if (!stmt) return std::unexpected(stmt.error());
  (*stmt)->bind(1, identity);
  if (auto ok = (*stmt)->run(); !ok) {
    return std::unexpected(ok.error().with_context("write the cluster identity"));
  }
  return {};
}

Result<bool> SqliteStore::holds_anything() {
  auto text = db_->query_text("SELECT EXISTS (SELECT 1 FROM users) OR EXISTS (SELECT 1 FROM jobs)");
  if (!text) return std::unexpected(text.error().with_context("look for users and jobs"));
  return *text == "1";
}

}  // namespace corral::store
