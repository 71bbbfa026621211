// corral-coordinator: init | issue-agent-cert | add-user | (run with --config).

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "common/core/files.hpp"
#include "common/core/version.hpp"
#include "common/model/config.hpp"
#include "common/net/pki.hpp"
#include "common/net/server.hpp"
#include "coordinator/service/cluster_identity.hpp"
#include "coordinator/service/coordinator.hpp"
#include "coordinator/store/sqlite_store.hpp"

namespace fs = std::filesystem;
using namespace corral;

namespace {

// The exit status of a start refused because the database is missing, empty or another
// cluster's: the unit does not restart on it (RestartPreventExitStatus), since only an
// operator can settle it.
constexpr int kRefusedState = 3;

int fail(const std::string& message, int code = 1) {
  std::cerr << "corral-coordinator: " << message << "\n";
  return code;
}

bool valid_user(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos;
}

Result<std::unique_ptr<store::SqliteStore>> open_store(const std::string& path, bool query_only = false) {
  store::SqliteStoreOptions options;
  options.query_only = query_only;
  return store::SqliteStore::open(path, options);
}

Result<void> add_user(store::Store& db, const std::string& name, bool admin) {
  if (!valid_user(name)) return make_error(ErrorCode::InvalidArgument, "user name must be 1 to 64 of [A-Za-z0-9._-]: " + name);
  std::string token = net::random_token();
  if (auto r = db.commit(store::Change{{store::UpsertUser{{name, net::sha256_hex(token), admin}}}}); !r) return r;
  std::cout << token << "\n";
  std::cerr << "corral-coordinator: token for " << (admin ? "admin " : "user ") << name
            << " printed above; it is shown only once and stored only as a hash\n";
  return {};
}

int add_user(const std::string& state_dir, const std::string& db_path, const std::string& name, bool admin) {
  if (!valid_user(name)) return fail("user name must be 1 to 64 of [A-Za-z0-9._-]: " + name, 2);
  // Not on a database that is missing or another cluster's: SQLite would make a new file,
  // and the next start would take a cluster of one user for this one.
  auto cluster = service::open_cluster_store(state_dir, db_path);
  if (!cluster) return fail(cluster.error().message());
  if (auto r = add_user(*cluster->store, name, admin); !r) return fail(r.error().message(), r.error().code() == ErrorCode::InvalidArgument ? 2 : 1);
  return 0;
}

// A new cluster's database: its identity, and its first admin's token.
int new_database(const std::string& state_dir, const std::string& db_path, const std::string& admin) {
  if (!valid_user(admin)) return fail("--admin: user name must be 1 to 64 of [A-Za-z0-9._-]: " + admin, 2);
  auto cluster = service::create_cluster_store(state_dir, db_path);
  if (!cluster) return fail(cluster.error().message());
  std::cerr << "corral-coordinator: cluster " << cluster->identity << " starts in " << db_path << "\n";
  if (auto r = add_user(*cluster->store, admin, true); !r) return fail(r.error().message());
  return 0;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

int init(const std::string& dir, std::vector<std::string> sans, const std::string& admin) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail("cannot create " + dir + ": " + ec.message());
  fs::permissions(dir, fs::perms::owner_all, ec);
  std::string ca = dir + "/ca.pem";
  if (fs::exists(ca)) return fail(dir + " already holds a cluster (ca.pem exists); refusing to overwrite it", 2);
  if (sans.empty()) sans = {"localhost", "127.0.0.1", host_name()};
  if (auto r = net::create_ca(ca, dir + "/ca.key", "corral cluster CA"); !r) return fail(r.error().message());
  net::CertSpec server{"corral-coordinator", sans, true, false};
  if (auto r = net::issue_certificate(ca, dir + "/ca.key", dir + "/server.pem", dir + "/server.key", server); !r) {
    return fail(r.error().message());
  }
  std::cerr << "corral-coordinator: created the cluster CA and the server certificate in " << dir << "\n";
  return new_database(dir, dir + "/corral.db", admin);
}

int issue_agent_cert(const std::string& dir, const std::string& node, const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return fail("cannot create " + out + ": " + ec.message());
  net::CertSpec spec{node, {}, false, true};
  auto r = net::issue_certificate(dir + "/ca.pem", dir + "/ca.key", out + "/" + node + ".pem", out + "/" + node + ".key", spec);
  if (!r) return fail(r.error().message());
  // An agent starting meanwhile reads the old CA or the new one, never half of one.
  std::ifstream ca_in(dir + "/ca.pem", std::ios::binary);
  std::string ca_pem((std::istreambuf_iterator<char>(ca_in)), std::istreambuf_iterator<char>());
  if (!ca_in.good() && !ca_in.eof()) return fail("cannot read " + dir + "/ca.pem");
  if (auto w = write_file_atomically(out + "/ca.pem", ca_pem, 0644); !w) return fail(w.error().message());
  std::cerr << "corral-coordinator: wrote " << out << "/" << node << ".pem, " << node << ".key and ca.pem\n";
  return 0;
}

// Every connection is a descriptor: the soft limit (1024 by default) goes up to the hard
// one, so clients' and agents' connections fit (max_connections plus one per agent).
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) spdlog::warn("cannot raise the open file limit: {}", std::strerror(errno));
}

int run(const std::string& config_path, const std::string& port_file) {
  auto config = model::load_coordinator_config(config_path);
  if (!config) return fail(config.error().message(), 2);
  auto cluster = service::open_cluster_store(config->state_dir, config->database_path());
  if (!cluster) return fail(cluster.error().message(), kRefusedState);
  raise_open_file_limit();
  net::EventLoop loop;
  SystemClock clock;
  service::Coordinator coordinator(loop, clock, *cluster->store, *config, cluster->identity);
  auto reader = open_store(config->database_path(), /*query_only=*/true);
  if (!reader) return fail(reader.error().message());
  coordinator.read_history_from(std::shared_ptr<store::Store>(std::move(*reader)));
  if (auto r = coordinator.start(); !r) return fail(r.error().message());
  net::ServerOptions opts;
  opts.host = config->listen_host;
  opts.port = config->listen_port;
  opts.local_socket = config->local_socket;
  opts.tls = {config->state_dir + "/ca.pem", config->state_dir + "/server.pem", config->state_dir + "/server.key"};
  opts.max_body_bytes = config->max_request_bytes;
  opts.max_connections = config->max_connections;
  opts.max_connections_per_address = config->max_connections_per_address;
  opts.ws_idle_timeout = config->node_timeout;
  auto server = net::Server::start(loop, opts, coordinator);
  if (!server) return fail(server.error().message());
  if (!port_file.empty()) {
    // Appears whole: scripts may poll for it.
    if (auto w = write_file_atomically(port_file, std::to_string((*server)->port()) + "\n", 0644); !w) {
      return fail("--port-file: " + w.error().message(), 2);
    }
  }
  spdlog::info("corral-coordinator listening on {}:{}{} (cluster {}, database {})", config->listen_host,
               (*server)->port(), config->local_socket.empty() ? "" : " and " + config->local_socket,
               cluster->identity, config->database_path());
  loop.on_shutdown_signal([&](int sig) {
    spdlog::info("signal {}: shutting down", sig);
    (*server)->stop();
    coordinator.shutdown();
    loop.stop();
  });
  loop.run();
  coordinator.shutdown();
  return coordinator.failed() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr (journald under systemd); stdout is for what a command prints.
  spdlog::set_default_logger(spdlog::stderr_color_mt("corral"));
  CLI::App app{"corral-coordinator: the cluster's queue, scheduler and rendezvous service"};
  app.set_version_flag("--version", corral::version_line("corral-coordinator"));
  app.require_subcommand(0, 1);
  std::string config_path;
  std::string port_file;
  app.add_option("--config", config_path, "coordinator.yaml");
  app.add_option("--port-file", port_file, "write the bound port here once listening");

  std::string state_dir;
  std::vector<std::string> sans;
  std::string admin = std::getenv("SUDO_USER") ? std::getenv("SUDO_USER") : (std::getenv("USER") ? std::getenv("USER") : "admin");
  auto* init_cmd = app.add_subcommand("init", "create the cluster CA, server certificate and first admin token");
  init_cmd->add_option("--state-dir", state_dir, "where the CA, certificates and database live")->required();
  init_cmd->add_option("--san", sans, "subject alt names of the server certificate (DNS names or IPs)");
  init_cmd->add_option("--admin", admin, "name of the first admin user (also their Unix user on the nodes)");

  std::string node;
  std::string out;
  auto* cert_cmd = app.add_subcommand("issue-agent-cert", "issue a node agent's client certificate");
  cert_cmd->add_option("--state-dir", state_dir)->required();
  cert_cmd->add_option("--node", node, "node name (the certificate's CN)")->required();
  cert_cmd->add_option("--out", out, "output folder")->required();

  std::string user;
  bool is_admin = false;
  std::string database;
  auto* user_cmd = app.add_subcommand("add-user", "create or replace a user's token");
  user_cmd->add_option("--state-dir", state_dir)->required();
  user_cmd->add_option("--database", database, "default: STATE_DIR/corral.db");
  user_cmd->add_option("name", user, "user name (also their Unix user on the nodes)")->required();
  user_cmd->add_flag("--admin", is_admin);

  auto* newdb_cmd = app.add_subcommand(
      "new-database", "start a new, empty cluster on an existing state folder whose database is gone (a new identity)");
  newdb_cmd->add_option("--state-dir", state_dir)->required();
  newdb_cmd->add_option("--database", database, "default: STATE_DIR/corral.db");
  newdb_cmd->add_option("--admin", admin, "name of the new cluster's first admin user");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (*init_cmd) return init(state_dir, sans, admin);
  if (*cert_cmd) return issue_agent_cert(state_dir, node, out);
  if (*user_cmd) return add_user(state_dir, database.empty() ? state_dir + "/corral.db" : database, user, is_admin);
  if (*newdb_cmd) return new_database(state_dir, database.empty() ? state_dir + "/corral.db" : database, admin);
  if (config_path.empty()) return fail("--config FILE is required to run (or use a subcommand; see --help)", 2);
  return run(config_path, port_file);
}
