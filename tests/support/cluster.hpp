#pragma once
// Test support: a real corral-coordinator process made with `init`, and agents'
// certificates made with `issue-agent-cert`. Binaries come from compile definitions
// CORRAL_COORDINATOR_BIN (and CORRAL_AGENT_BIN, CORRAL_CLI_BIN, CORRAL_WORKER_BIN).

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/net/http_client.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::testing {

// Where a test daemon runs: the address it listens on or advertises, and the argv prefix
// that puts it there (`ip netns exec NS` for a host in a NetnsLab). By default loopback in
// the test's own network namespace.
struct Placement {
  std::string address = "127.0.0.1";
  std::vector<std::string> exec_prefix;
};

inline std::vector<std::string> placed(const Placement& where, std::vector<std::string> argv) {
  argv.insert(argv.begin(), where.exec_prefix.begin(), where.exec_prefix.end());
  return argv;
}

class CoordinatorProcess {
 public:
  // Nodes not heard from for this long take no new job (the node_timeout start()
  // configures), and are lost (node_lost_timeout) after kNodeLostTimeout: as short, so
  // that tests of a loss run quickly, unless `settings` names node_lost_timeout.
  static constexpr std::chrono::milliseconds kNodeTimeout{1500};
  static constexpr std::chrono::milliseconds kNodeLostTimeout = kNodeTimeout;

  // `admin` names the first admin (whose token token() is); jobs it submits run as
  // that Unix user on real agents. The server certificate names `where.address`.
  explicit CoordinatorProcess(const TempDir& dir, std::string settings = {}, std::string admin = "tester",
                              Placement where = {})
      : state_dir_(dir.file("state")), config_(dir.file("coordinator.yaml")), port_file_(dir.file("port")),
        agents_dir_(dir.file("agents")), where_(std::move(where)) {
    auto [rc, out] = run({CORRAL_COORDINATOR_BIN, "init", "--state-dir", state_dir_, "--admin", admin, "--san",
                          where_.address, "--san", "localhost"});
    init_ok_ = rc == 0;
    token_ = out.substr(0, out.find('\n'));
    settings_ = std::move(settings);
  }

  bool init_ok() const { return init_ok_; }
  // More settings for the next start().
  void add_settings(const std::string& lines) { settings_ += lines; }
  const std::string& token() const { return token_; }
  std::string ca() const { return state_dir_ + "/ca.pem"; }
  std::string database() const { return state_dir_ + "/corral.db"; }
  std::string url() const {
    bool v6 = where_.address.find(':') != std::string::npos;
    return "https://" + (v6 ? "[" + where_.address + "]" : where_.address) + ":" + std::to_string(port_);
  }
  int port() const { return port_; }
  Child& process() { return child_; }

  // The first start binds a free port; a restart binds the same one, as a real
  // coordinator at a fixed address does, so agents find it again.
  bool start() {
    std::ofstream(config_) << "listen: " << where_.address << ":" << port_ << "\nstate_dir: " << state_dir_
                           << "\nheartbeat_interval: 100ms\nnode_timeout: " << kNodeTimeout.count()
                           << "ms\nreconnect_grace: 3s\nkill_grace: 1s\nschedule_interval: 200ms\n"
                           << (settings_.find("node_lost_timeout:") == std::string::npos
                                   ? "node_lost_timeout: " + std::to_string(kNodeLostTimeout.count()) + "ms\n"
                                   : std::string())
                           << settings_;
    std::filesystem::remove(port_file_);
    if (!child_.start(placed(where_, {CORRAL_COORDINATOR_BIN, "--config", config_, "--port-file", port_file_}))) {
      return false;
    }
    if (!child_.wait_for_line("listening on")) return false;
    std::ifstream in(port_file_);
    in >> port_;
    return port_ > 0;
  }
  void kill9() { child_.kill_and_wait(SIGKILL); }
  void stop() { child_.kill_and_wait(SIGTERM); }

  // Issues a client certificate for `node`; returns the folder holding NODE.pem/.key and ca.pem.
  std::string agent_cert(const std::string& node) {
    auto [rc, out] = run({CORRAL_COORDINATOR_BIN, "issue-agent-cert", "--state-dir", state_dir_, "--node", node,
                          "--out", agents_dir_});
    return rc == 0 ? agents_dir_ : std::string();
  }

  std::string add_user(const std::string& name, bool admin = false) {
    std::vector<std::string> argv = {CORRAL_COORDINATOR_BIN, "add-user", "--state-dir", state_dir_, name};
    if (admin) argv.push_back("--admin");
    auto [rc, out] = run(argv);
    return rc == 0 ? out.substr(0, out.find('\n')) : std::string();
  }

  std::unique_ptr<net::HttpClient> client(Duration timeout = std::chrono::seconds(10)) const {
    auto c = net::HttpClient::create(url(), {ca(), "", ""}, timeout);
    return c ? std::move(*c) : nullptr;
  }

 private:
  std::string state_dir_;
  std::string config_;
  std::string port_file_;
  std::string agents_dir_;
  Placement where_;
  std::string settings_;
  std::string token_;
  bool init_ok_ = false;
  int port_ = 0;
  Child child_;
};

// A port range of 100 below the kernel's ephemeral range, chosen by pid, so test
// processes that ctest runs side by side on 127.0.0.1 do not meet on master ports.
inline std::string test_port_range() {
  int first = 20000 + static_cast<int>(::getpid() % 120) * 100;
  return std::to_string(first) + "-" + std::to_string(first + 99);
}

#ifdef CORRAL_AGENT_BIN
// A real corral-agent with a simulated inventory (or, with no `sim_file`, nvidia-smi's),
// joined to `coordinator`; it runs where `where` says and advertises that address.
class AgentProcess {
 public:
  AgentProcess(CoordinatorProcess& coordinator, const TempDir& dir, std::string node, std::string sim_file,
               Placement where = {}, std::string ports = test_port_range())
      : node_(std::move(node)), config_(dir.file(node_ + ".yaml")), spool_(dir.file("spool-" + node_)),
        where_(std::move(where)) {
    std::string certs = coordinator.agent_cert(node_);
    std::ofstream(config_) << "node: " << node_ << "\ncoordinator: " << coordinator.url() << "\nca: " << certs
                           << "/ca.pem\ncert: " << certs << "/" << node_ << ".pem\nkey: " << certs << "/" << node_
                           << ".key\nspool: " << spool_ << "\nadvertise: " << where_.address << "\nports: " << ports
                           << "\nallow_root_jobs: true\nreconnect_max_backoff: 500ms\n";
    if (!sim_file.empty()) configure("simulate: " + sim_file);
  }

  // Adds lines to the agent's config (before start()); a key given here replaces the
  // default worker.
  void configure(const std::string& lines) {
    std::ofstream(config_, std::ios::app) << lines << "\n";
    if (lines.find("worker:") != std::string::npos) custom_worker_ = true;
  }

  // Starts the agent; true once the coordinator has welcomed it (or at once, if not `welcomed`).
  bool start(bool welcomed = true) {
    if (!custom_worker_) {
      configure("worker: " CORRAL_WORKER_BIN);
      custom_worker_ = true;
    }
    if (!child_.start(placed(where_, {CORRAL_AGENT_BIN, "--config", config_}))) return false;
    return !welcomed || child_.wait_for_line("welcomed by the coordinator");
  }
  // After the coordinator restarted: true once this agent is welcomed again.
  bool rejoined() { return child_.wait_for_line("welcomed by the coordinator", std::chrono::seconds(20)); }
  // SIGKILL to the agent alone: its ranks, in their own process groups, live on.
  void kill9() {
    ::kill(child_.pid(), SIGKILL);
    child_.wait();
  }
  void stop() { child_.kill_and_wait(SIGTERM); }
  Child& process() { return child_; }
  const std::string& spool() const { return spool_; }

 private:
  std::string node_;
  std::string config_;
  std::string spool_;
  Placement where_;
  bool custom_worker_ = false;
  Child child_;
};
#endif

}  // namespace corral::testing
