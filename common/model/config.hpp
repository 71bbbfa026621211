#pragma once
// Daemon configuration: the coordinator's and the agent's YAML files as plain values.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/model/inventory.hpp"

namespace corral::model {

// Slurm's PrivateData: each item set limits that data to its owner and admins
// (docs/operations.md, "Private data"). None set: everyone with a token sees everything.
struct PrivateData {
  bool history = false;  // GET /v1/history
  bool usage = false;    // GET /v1/usage, and per-user metrics
  bool jobs = false;     // job lists, a job's details, the status page's queue and grid, per-user metrics

  bool any() const { return history || usage || jobs; }
};

struct CoordinatorConfig {
  std::string listen_host = "0.0.0.0";
  int listen_port = 7433;                      // 0: any free port
  std::string state_dir = "/var/lib/corral";   // CA, server certificate, database
  std::string database;                        // default: state_dir/corral.db
  // A Unix socket for clients on the coordinator's machine (plain HTTP, tokens as over
  // TLS); empty: none.
  std::string local_socket;
  Duration heartbeat_interval = std::chrono::seconds(1);
  // Silent this long: the node takes no new job (NodeDown), its jobs run on.
  Duration node_timeout = std::chrono::seconds(5);
  // Silent this long: the node is lost, its jobs end NODE_FAIL or are requeued (as
  // Slurm's SlurmdTimeout). A network blip must not end healthy training.
  Duration node_lost_timeout = std::chrono::minutes(5);
  Duration reconnect_grace = std::chrono::seconds(30);
  Duration kill_grace = std::chrono::seconds(10);
  Duration schedule_interval = std::chrono::seconds(1);
  Duration fair_share_half_life = std::chrono::hours(24);
  std::size_t max_connections = 512;              // clients' connections (agents' links are apart)
  std::size_t max_connections_per_address = 64;
  std::size_t max_request_bytes = 1024 * 1024;
  bool public_status = true;                   // status page and /metrics without a token
  PrivateData private_data;

  std::string database_path() const { return database.empty() ? state_dir + "/corral.db" : database; }
};

struct AgentConfig {
  std::string node;
  std::string coordinator;                     // https://host:port
  std::string ca;
  std::string cert;
  std::string key;
  std::string spool = "/var/lib/corral-agent";
  std::string advertise;                       // MASTER_ADDR for ranks 0 here; ports reserved per address
  PortRange ports;
  std::string simulate;                        // a simulated inventory file instead of nvidia-smi
  bool allow_root_jobs = false;
  std::string nvidia_smi = "nvidia-smi";
  std::string worker = "corral-worker";        // for nccl-root and preflight
  Duration preflight_interval = std::chrono::minutes(5);
  Duration reconnect_max_backoff = std::chrono::seconds(5);
  // The most bytes a rank's log keeps: past it, its head and its latest tail, and a line
  // saying how much was cut between them.
  std::uint64_t rank_log_cap = std::uint64_t{1} << 30;
};

// Both refuse unknown keys and name file:line:col and the key on every problem.
Result<CoordinatorConfig> parse_coordinator_config(std::string_view yaml, std::string_view file_name);
Result<AgentConfig> parse_agent_config(std::string_view yaml, std::string_view file_name);
// Relative paths in a config file are relative to the file's folder.
Result<CoordinatorConfig> load_coordinator_config(const std::string& path);
Result<AgentConfig> load_agent_config(const std::string& path);

}  // namespace corral::model
