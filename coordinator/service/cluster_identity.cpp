#include "coordinator/service/cluster_identity.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include "common/core/files.hpp"
#include "common/net/pki.hpp"

namespace corral::service {
namespace {

enum class DbFile { Missing, Empty, Present };

Result<DbFile> database_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return DbFile::Missing;
    return make_error(ErrorCode::Unavailable, "cannot look at " + path + ": " + std::strerror(errno));
  }
  return st.st_size == 0 ? DbFile::Empty : DbFile::Present;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The identity file's one line; nullopt when there is no file.
Result<std::optional<std::string>> read_identity(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (!exists(path)) return std::nullopt;
    return make_error(ErrorCode::Unavailable, "cannot read " + path + ": " + std::strerror(errno));
  }
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.empty() || line.size() > 128) {
    return make_error(ErrorCode::Conflict, path + " does not hold a cluster identity (one line of 1 to 128 characters)");
  }
  return line;
}

Result<void> write_identity(const std::string& path, const std::string& identity) {
  return write_file_atomically(path, identity + "\n", 0644);
}

std::string new_identity() { return net::random_token().substr(0, 32); }

Result<std::unique_ptr<store::SqliteStore>> open_store(const std::string& db_path) {
  return store::SqliteStore::open(db_path);
}

std::string start_over_hint(const std::string& state_dir) {
  return "restore the database from a backup (docs/operations.md, \"Backups\"), or, to start a new, empty cluster "
         "on this state (every agent then holds the ranks it runs until it is restarted), run "
         "`corral-coordinator new-database --state-dir " + state_dir + "`";
}

}  // namespace

std::string cluster_identity_path(const std::string& state_dir) { return state_dir + "/cluster-id"; }

Result<ClusterStore> open_cluster_store(const std::string& state_dir, const std::string& db_path) {
  const std::string id_path = cluster_identity_path(state_dir);
  auto file_id = read_identity(id_path);
  if (!file_id) return std::unexpected(file_id.error());
  // Before identities, a cluster's state folder was known by its CA.
  const bool lived = file_id->has_value() || exists(state_dir + "/ca.pem");
  auto said = [&] {
    return file_id->has_value() ? id_path + " says cluster " + **file_id + " lived here"
                                : state_dir + "/ca.pem says a cluster lived here";
  };
  auto file = database_file(db_path);
  if (!file) return std::unexpected(file.error());
  if (*file != DbFile::Present) {
    const std::string what = *file == DbFile::Missing ? "is missing" : "is empty (0 bytes)";
    if (!lived) {
      return make_error(ErrorCode::NotFound, "the database " + db_path + " " + what +
                                                 " and " + state_dir +
                                                 " holds no cluster: create one with `corral-coordinator init "
                                                 "--state-dir " + state_dir + "`");
    }
    return make_error(ErrorCode::Conflict,
                      "the database " + db_path + " " + what + ", but " + said() + "; " + start_over_hint(state_dir));
  }
  auto store = open_store(db_path);
  if (!store) return std::unexpected(store.error());
  auto db_id = (*store)->cluster_identity();
  if (!db_id) return std::unexpected(db_id.error());
  if (db_id->has_value()) {
    if (file_id->has_value() && **file_id != **db_id) {
      return make_error(ErrorCode::Conflict, "the database " + db_path + " belongs to cluster " + **db_id + ", but " +
                                                 said() + "; start the coordinator with the database of cluster " +
                                                 **file_id + ", or " + start_over_hint(state_dir));
    }
    if (!file_id->has_value()) {
      if (auto w = write_identity(id_path, **db_id); !w) return std::unexpected(w.error());
      spdlog::info("wrote the database's cluster identity {} to {}", **db_id, id_path);
    }
    return ClusterStore{std::move(*store), **db_id};
  }
  auto holds = (*store)->holds_anything();
  if (!holds) return std::unexpected(holds.error());
  if (!*holds) {
    if (!lived) {
      return make_error(ErrorCode::NotFound, "the database " + db_path + " holds no cluster: create one with "
                                             "`corral-coordinator init --state-dir " + state_dir + "`");
    }
    return make_error(ErrorCode::Conflict, "the database " + db_path +
                                               " holds no cluster (no identity, no user, no job), but " + said() +
                                               "; " + start_over_hint(state_dir));
  }
  // A cluster from before identities: it keeps its state and gets its identity now.
  std::string identity = file_id->has_value() ? **file_id : new_identity();
  if (auto ok = (*store)->set_cluster_identity(identity); !ok) return std::unexpected(ok.error());
  if (auto w = write_identity(id_path, identity); !w) return std::unexpected(w.error());
  spdlog::warn("the database {} had no cluster identity: it is cluster {} from now on ({})", db_path, identity,
               id_path);
  return ClusterStore{std::move(*store), std::move(identity)};
}

Result<ClusterStore> create_cluster_store(const std::string& state_dir, const std::string& db_path) {
  auto file = database_file(db_path);
  if (!file) return std::unexpected(file.error());
  const std::string id_path = cluster_identity_path(state_dir);
  auto old_id = read_identity(id_path);
  if (*file == DbFile::Empty) {
    // SQLite would take a 0-byte file for a new database; start from no file at all, so
    // that no stale -wal or -shm beside it is read into the new one.
    for (const char* suffix : {"", "-wal", "-shm"}) {
      if (::unlink((db_path + suffix).c_str()) != 0 && errno != ENOENT) {
        return make_error(ErrorCode::Unavailable, "cannot remove " + db_path + suffix + ": " + std::strerror(errno));
      }
    }
  }
  auto store = open_store(db_path);
  if (!store) return std::unexpected(store.error());
  auto db_id = (*store)->cluster_identity();
  if (!db_id) return std::unexpected(db_id.error());
  auto holds = (*store)->holds_anything();
  if (!holds) return std::unexpected(holds.error());
  if (db_id->has_value() || *holds) {
    return make_error(ErrorCode::Conflict,
                      "the database " + db_path + " holds cluster " + (db_id->has_value() ? **db_id : "(no identity)") +
                          "; a new cluster starts only on a missing or empty database: move that one away first");
  }
  std::string identity = new_identity();
  if (old_id && old_id->has_value()) {
    if (auto w = write_identity(id_path + ".previous", **old_id); !w) return std::unexpected(w.error());
  }
  // The state folder first: killed between the two writes, this leaves a database that
  // holds nothing, which a start refuses and the same command runs on again; the other
  // order would leave a database naming a cluster the state folder does not know.
  if (auto w = write_identity(id_path, identity); !w) return std::unexpected(w.error());
  if (auto ok = (*store)->set_cluster_identity(identity); !ok) return std::unexpected(ok.error());
  return ClusterStore{std::move(*store), std::move(identity)};
}

}  // namespace corral::service
