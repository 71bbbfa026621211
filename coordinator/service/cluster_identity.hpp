#pragma once
// A cluster knows itself: `corral-coordinator init` writes a cluster identity into the
// state folder (cluster-id) and into the database, and every later start checks that the
// two agree before anything is served. A missing, empty or foreign database where the
// state folder says a cluster lived is refused, never taken for a new cluster: agents
// would otherwise be told that none of their jobs exists, and kill them. Runs once, at
// start, before the event loop.

#include <memory>
#include <string>

#include "common/core/error.hpp"
#include "coordinator/store/sqlite_store.hpp"

namespace corral::service {

struct ClusterStore {
  std::unique_ptr<store::SqliteStore> store;
  std::string identity;
};

// The state folder's identity file.
std::string cluster_identity_path(const std::string& state_dir);

// Opens the database of the cluster whose state is in `state_dir`. Refused (Conflict,
// with the file and what to do) when the database is missing or empty (no user, no job,
// no identity) while the state folder has an identity or a CA, or when the two name
// different clusters. A database made before identities is given the state folder's
// identity (or a new one), logged.
[[nodiscard]] Result<ClusterStore> open_cluster_store(const std::string& state_dir, const std::string& db_path);

// A new cluster on this state folder: the database must be missing or hold nothing; a new
// identity goes into it and replaces the state folder's (the old one is kept beside it as
// cluster-id.previous). For `init`, and for `new-database`, the explicit way to start over.
[[nodiscard]] Result<ClusterStore> create_cluster_store(const std::string& state_dir, const std::string& db_path);

}  // namespace corral::service
