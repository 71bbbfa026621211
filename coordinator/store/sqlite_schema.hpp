#pragma once
// The SqliteStore schema as a list of forward migrations, and the code that brings a
// database up to date. Migration N takes user_version N-1 to N; a database newer than
// the last migration this build knows is refused, never guessed at.

#include <span>
#include <string_view>

#include "common/core/error.hpp"
#include "coordinator/store/sqlite_connection.hpp"

namespace corral::store {

struct SqliteMigration {
  int version;           // the user_version after it
  std::string_view sql;  // may hold several statements
};

// In order; append, never edit a released one.
std::span<const SqliteMigration> sqlite_migrations();
int latest_sqlite_schema_version();

// Applies each missing migration in its own transaction. Conflict when the database's
// user_version is newer than latest_sqlite_schema_version().
[[nodiscard]] Result<void> migrate_sqlite_schema(SqliteConnection& db);

}  // namespace corral::store
