#pragma once
// SqliteConnection: one sqlite3 handle, its cache of prepared statements, and the mapping
// of SQLite result codes to corral Errors. Private to corral_store: sqlite3.h is included
// only by the .cpp files of this folder, so no sqlite3* reaches a public type.
// Not thread-safe, like the Store that owns it.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/core/error.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace corral::store {

// A cached prepared statement, borrowed for one use: bind, step, read columns. Resetting
// on destruction returns it to the cache clean, whatever path the caller took out.
class SqliteStatement {
 public:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;
  ~SqliteStatement();

  // Parameters are 1-based, as in SQL. A bind failure is remembered and reported by step().
  SqliteStatement& bind(int index, std::int64_t value);
  SqliteStatement& bind(int index, std::string_view text);
  SqliteStatement& bind_null(int index);
  template <typename T>
  SqliteStatement& bind(int index, const std::optional<T>& value) {
    return value ? bind(index, *value) : bind_null(index);
  }

  // true: a row is ready; false: the statement is done.
  [[nodiscard]] Result<bool> step();
  // Steps to completion, for statements that return no rows.
  [[nodiscard]] Result<void> run();

  bool is_null(int column) const;
  std::int64_t int64(int column) const;
  std::string text(int column) const;
  std::optional<std::int64_t> optional_int64(int column) const;
  std::optional<std::string> optional_text(int column) const;

  // Rows changed by the last run() of this connection.
  std::int64_t changes() const;
  // The extended result code of the last failure, e.g. to tell a primary key from a
  // foreign key violation.
  int extended_error_code() const;

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int bind_error_ = 0;
};

class SqliteConnection {
 public:
  // Opens (creating if needed) the database file; nothing is read from it yet, so a file
  // that is not a database only fails at the first statement.
  [[nodiscard]] static Result<std::unique_ptr<SqliteConnection>> open(const std::string& path);
  SqliteConnection(const SqliteConnection&) = delete;
  SqliteConnection& operator=(const SqliteConnection&) = delete;
  ~SqliteConnection();

  // Runs one or more statements that return no rows (DDL, BEGIN, COMMIT, PRAGMA x=y).
  [[nodiscard]] Result<void> exec(std::string_view sql);
  // One statement that returns no rows, through the statement cache: BEGIN, SAVEPOINT...
  [[nodiscard]] Result<void> run(std::string_view sql);
  // The first column of the first row of `sql` as text; empty when there is no row.
  [[nodiscard]] Result<std::string> query_text(std::string_view sql);
  // Prepared once per distinct SQL text, then reused for the life of the connection.
  [[nodiscard]] Result<std::unique_ptr<SqliteStatement>> prepare(std::string_view sql);

  [[nodiscard]] Result<void> set_busy_timeout(int milliseconds);
  // False in autocommit mode. After an error this is how we learn that SQLite rolled the
  // whole transaction back by itself (it does on SQLITE_FULL, IOERR, NOMEM, BUSY).
  bool in_transaction() const;
  const std::string& path() const { return path_; }

 private:
  SqliteConnection(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_;
  std::string path_;
  std::map<std::string, sqlite3_stmt*, std::less<>> statements_;
};

// The corral ErrorCode for an SQLite (extended) result code.
ErrorCode error_code_for_sqlite(int code);
// An Error with SQLite's own message and code name: "<context>: UNIQUE constraint failed:
// gpu_holds.node, gpu_holds.gpu_index (SQLITE_CONSTRAINT_PRIMARYKEY)".
Error sqlite_error(sqlite3* db, int code, std::string_view context);

}  // namespace corral::store
