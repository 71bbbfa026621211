#include "coordinator/store/sqlite_connection.hpp"

#include <limits>

#include <sqlite3.h>

#include "common/core/check.hpp"

namespace corral::store {

namespace {

// clang-format off: one line per code reads better as a table.
std::string_view code_name(int code) {
  switch (code) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
      return "SQLITE_CONSTRAINT_PRIMARYKEY";
    case SQLITE_CONSTRAINT_UNIQUE:
      return "SQLITE_CONSTRAINT_UNIQUE";
    case SQLITE_CONSTRAINT_FOREIGNKEY:
      return "SQLITE_CONSTRAINT_FOREIGNKEY";
    case SQLITE_CONSTRAINT_CHECK:
      return "SQLITE_CONSTRAINT_CHECK";
    case SQLITE_CONSTRAINT_NOTNULL:
      return "SQLITE_CONSTRAINT_NOTNULL";
    case SQLITE_CONSTRAINT_DATATYPE:
      return "SQLITE_CONSTRAINT_DATATYPE";
    default:
      break;
  }
  switch (code & 0xff) {
    case SQLITE_ERROR:
      return "SQLITE_ERROR";
    case SQLITE_INTERNAL:
      return "SQLITE_INTERNAL";
    case SQLITE_PERM:
      return "SQLITE_PERM";
    case SQLITE_ABORT:
      return "SQLITE_ABORT";
    case SQLITE_BUSY:
      return "SQLITE_BUSY";
    case SQLITE_LOCKED:
      return "SQLITE_LOCKED";
    case SQLITE_NOMEM:
      return "SQLITE_NOMEM";
    case SQLITE_READONLY:
      return "SQLITE_READONLY";
    case SQLITE_INTERRUPT:
      return "SQLITE_INTERRUPT";
    case SQLITE_IOERR:
      return "SQLITE_IOERR";
    case SQLITE_CORRUPT:
      return "SQLITE_CORRUPT";
    case SQLITE_FULL:
      return "SQLITE_FULL";
    case SQLITE_CANTOPEN:
      return "SQLITE_CANTOPEN";
    case SQLITE_PROTOCOL:
      return "SQLITE_PROTOCOL";
    case SQLITE_SCHEMA:
      return "SQLITE_SCHEMA";
    case SQLITE_TOOBIG:
      return "SQLITE_TOOBIG";
    case SQLITE_CONSTRAINT:
      return "SQLITE_CONSTRAINT";
    case SQLITE_MISMATCH:
      return "SQLITE_MISMATCH";
    case SQLITE_MISUSE:
      return "SQLITE_MISUSE";
    case SQLITE_RANGE:
      return "SQLITE_RANGE";
    case SQLITE_NOTADB:
      return "SQLITE_NOTADB";
    default:
      return "SQLITE_UNKNOWN";
  }
}
// clang-format on

// The statement as context for an error, cut short: the caller adds what it was doing.
std::string statement_context(std::string_view text) {
  constexpr std::size_t kMax = 60;
  auto start = text.find_first_not_of(" \n");
  std::string sql(start == std::string_view::npos ? text : text.substr(start));
  for (char& c : sql) {
    if (c == '\n') c = ' ';
  }
  if (sql.size() > kMax) sql = sql.substr(0, kMax) + "...";
  return sql;
}

}  // namespace

ErrorCode error_code_for_sqlite(int code) {
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_PROTOCOL:
      return ErrorCode::Unavailable;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
    case SQLITE_TOOBIG:
      return ErrorCode::ResourceExhausted;
    case SQLITE_CONSTRAINT:
      return ErrorCode::Conflict;
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return ErrorCode::PermissionDenied;
    default:
      return ErrorCode::Internal;
  }
}

Error sqlite_error(sqlite3* db, int code, std::string_view context) {
  std::string msg(context);
  msg += ": ";
  // sqlite3_errmsg names the table and columns of a constraint; errstr is the fallback
  // when there is no handle (a failed open) or the handle's message is stale.
  const char* detail =
      db != nullptr && sqlite3_extended_errcode(db) == code ? sqlite3_errmsg(db) : sqlite3_errstr(code);
  msg += detail;
  msg += " (";
  msg += code_name(code);
  msg += ")";
  return Error(error_code_for_sqlite(code), std::move(msg));
}

// ---- SqliteStatement ----

SqliteStatement::~SqliteStatement() {
  // Both only report the last step's error again, which step() already returned.
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

SqliteStatement& SqliteStatement::bind(int index, std::int64_t value) {
  int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}

SqliteStatement& SqliteStatement::bind(int index, std::string_view text) {
  if (text.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    if (bind_error_ == 0) bind_error_ = SQLITE_TOOBIG;
    return *this;
  }
  // SQLITE_TRANSIENT: callers bind temporaries (JSON text, to_string results).
  int rc = sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}

SqliteStatement& SqliteStatement::bind_null(int index) {
  int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK && bind_error_ == 0) bind_error_ = rc;
  return *this;
}

Result<bool> SqliteStatement::step() {
  if (bind_error_ != 0) {
    return std::unexpected(
        sqlite_error(nullptr, bind_error_, "bind " + statement_context(sqlite3_sql(stmt_))));
  }
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return std::unexpected(
      sqlite_error(db_, sqlite3_extended_errcode(db_), statement_context(sqlite3_sql(stmt_))));
}

Result<void> SqliteStatement::run() {
  while (true) {
    auto row = step();
    if (!row) return std::unexpected(row.error());
    if (!*row) return {};
  }
}

bool SqliteStatement::is_null(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

std::int64_t SqliteStatement::int64(int column) const {
  return sqlite3_column_int64(stmt_, column);
}

std::string SqliteStatement::text(int column) const {
  const auto* data = sqlite3_column_text(stmt_, column);
  int size = sqlite3_column_bytes(stmt_, column);
  if (data == nullptr || size <= 0) return {};
  return std::string(reinterpret_cast<const char*>(data), static_cast<std::size_t>(size));
}

std::optional<std::int64_t> SqliteStatement::optional_int64(int column) const {
  if (is_null(column)) return std::nullopt;
  return int64(column);
}

std::optional<std::string> SqliteStatement::optional_text(int column) const {
  if (is_null(column)) return std::nullopt;
  return text(column);
}

std::int64_t SqliteStatement::changes() const {
  return sqlite3_changes64(db_);
}

int SqliteStatement::extended_error_code() const {
  return sqlite3_extended_errcode(db_);
}

// ---- SqliteConnection ----

Result<std::unique_ptr<SqliteConnection>> SqliteConnection::open(const std::string& path) {
  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    Error err = sqlite_error(db, db != nullptr ? sqlite3_extended_errcode(db) : rc, "sqlite3_open_v2");
    sqlite3_close_v2(db);  // a handle is returned even on failure, except out of memory
    return std::unexpected(err);
  }
  sqlite3_extended_result_codes(db, 1);
  return std::unique_ptr<SqliteConnection>(new SqliteConnection(db, path));
}

SqliteConnection::~SqliteConnection() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  // Nothing to do with a failure here: every statement is finalized, so close succeeds
  // unless SQLite itself is broken, and _v2 then closes once it can.
  sqlite3_close_v2(db_);
}

Result<void> SqliteConnection::exec(std::string_view sql) {
  std::string text(sql);
  char* errmsg = nullptr;
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &errmsg);
  sqlite3_free(errmsg);  // the same text sqlite3_errmsg gives
  if (rc != SQLITE_OK) {
    return std::unexpected(sqlite_error(db_, sqlite3_extended_errcode(db_), statement_context(text)));
  }
  return {};
}

Result<void> SqliteConnection::run(std::string_view sql) {
  auto stmt = prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  return (*stmt)->run();
}

Result<std::string> SqliteConnection::query_text(std::string_view sql) {
  auto stmt = prepare(sql);
  if (!stmt) return std::unexpected(stmt.error());
  auto row = (*stmt)->step();
  if (!row) return std::unexpected(row.error());
  if (!*row) return std::string();
  return (*stmt)->text(0);
}

Result<std::unique_ptr<SqliteStatement>> SqliteConnection::prepare(std::string_view sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT,
                                &stmt, nullptr);
    if (rc != SQLITE_OK) {
      return std::unexpected(
          sqlite_error(db_, sqlite3_extended_errcode(db_), "prepare " + statement_context(sql)));
    }
    it = statements_.emplace(std::string(sql), stmt).first;
  }
  // The store never nests two uses of one statement; if it did, the reset of the inner
  // use would silently end the outer one.
  CORRAL_CHECK(!sqlite3_stmt_busy(it->second));
  return std::make_unique<SqliteStatement>(db_, it->second);
}

Result<void> SqliteConnection::set_busy_timeout(int milliseconds) {
  int rc = sqlite3_busy_timeout(db_, milliseconds);
  if (rc != SQLITE_OK) return std::unexpected(sqlite_error(db_, rc, "set busy_timeout"));
  return {};
}

bool SqliteConnection::in_transaction() const {
  return sqlite3_get_autocommit(db_) == 0;
}

}  // namespace corral::store
