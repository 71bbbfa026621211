// agent_swarm: N simulated nodes in one process, each a real agent connection to a running
// coordinator (its own certificate, TLS, the WebSocket and the agent protocol), for the
// scale figures of bench/scale.py. Each node says hello with G simulated GPUs, heartbeats
// at the interval the coordinator asks for, answers Prepare, and "runs" what it is
// launched: a rank starts at once (or node i's, (i * 7919) % S ms later with
// --start-spread-ms S, as real nodes' forks spread) and exits 0 at once, or after N
// seconds when the job's command is `sleep N`; a Kill ends the node's ranks of the
// attempt. Nothing is forked.
//
//   agent_swarm --url https://127.0.0.1:PORT --state-dir STATE --certs DIR [--nodes 2000]
//               [--gpus 8] [--connecting 32] [--prefix swarm] [--start-spread-ms 0]
//
// Node i advertises 127.1.(i/250).(i%250+1). Certificates are issued into --certs with
// the CA in STATE (as `corral-coordinator issue-agent-cert` does), once; later runs reuse
// them. At most --connecting handshakes are in flight at once (all come from one address,
// as the coordinator caps per address).
// Prints to stdout, one line each: "joined N S" when all N nodes are welcomed, after S
// seconds; "launch JOB ATTEMPT UNIX_NS" for each Launch (the first node's of a job), so
// that the caller can time submit to start. SIGINT or SIGTERM ends it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "common/net/event_loop.hpp"
#include "common/net/pki.hpp"
#include "common/net/ws_client.hpp"
#include "common/protocol/codec.hpp"

using namespace corral;

namespace {

std::string arg(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return dflt;
}

std::int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// How long a launched rank "runs": N for `sleep N`, else 0.
Duration run_time(const model::Command& command) {
  std::vector<std::string> words;
  if (command.shell) {
    std::string text = command.argv.empty() ? "" : command.argv.front();
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t end = text.find(' ', at);
      if (end == std::string::npos) end = text.size();
      if (end > at) words.push_back(text.substr(at, end - at));
      at = end + 1;
    }
  } else {
    words = command.argv;
  }
  if (words.size() == 2 && words[0] == "sleep") {
    try {
      return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(std::stod(words[1])));
    } catch (const std::exception&) {
    }
  }
  return Duration::zero();
}

class Swarm;

class Node {
 public:
  Node(Swarm& swarm, net::EventLoop& loop, std::string name, net::WsClientOptions options, protocol::Hello hello,
       Duration start_delay)
      : swarm_(swarm), loop_(loop), name_(std::move(name)), options_(std::move(options)), hello_(std::move(hello)),
        start_delay_(start_delay), heartbeat_(loop), retry_(loop) {}

  void connect();
  const std::string& name() const { return name_; }

 private:
  struct Running {
    std::vector<int> ranks;
    std::unique_ptr<net::Timer> started;  // the ranks' starts, --start-spread-ms after the Launch
    std::unique_ptr<net::Timer> timer;
  };
  void send(const protocol::AgentMessage& m) {
    if (ws_ && ws_->open()) ws_->send(protocol::encode(m));
  }
  void on_message(const std::string& text);
  void launch(const protocol::Launch& l);
  void end(model::JobId job, int attempt, int signal);

  Swarm& swarm_;
  net::EventLoop& loop_;
  std::string name_;
  net::WsClientOptions options_;
  protocol::Hello hello_;
  Duration start_delay_;
  std::unique_ptr<net::WsClient> ws_;
  net::Timer heartbeat_;
  net::Timer retry_;
  bool welcomed_ = false;
  std::map<std::pair<model::JobId, int>, Running> running_;
};

class Swarm {
 public:
  Swarm(net::EventLoop& loop, std::size_t connecting) : loop_(loop), connecting_limit_(connecting) {}

  void add(std::unique_ptr<Node> node) { nodes_.push_back(std::move(node)); }
  void start() {
    started_ = std::chrono::steady_clock::now();
    for (auto& n : nodes_) queue_.push_back(n.get());
    next();
  }
  // A connection attempt ended (welcomed or failed): room for the next one.
  void attempt_ended() {
    --connecting_;
    next();
  }
  void queue(Node* n) {
    queue_.push_back(n);
    next();
  }
  void welcomed() {
    if (++welcomed_ == nodes_.size()) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      std::printf("joined %zu %.2f\n", nodes_.size(), s);
      std::fflush(stdout);
    }
  }
  void left() { --welcomed_; }
  void launched(model::JobId job, int attempt) {
    if (announced_.insert({job, attempt}).second) {
      std::printf("launch %llu %d %lld\n", static_cast<unsigned long long>(job), attempt,
                  static_cast<long long>(unix_ns()));
      std::fflush(stdout);
    }
    if (announced_.size() > 100000) announced_.clear();
  }

 private:
  void next() {
    while (connecting_ < connecting_limit_ && !queue_.empty()) {
      Node* n = queue_.front();
      queue_.pop_front();
      ++connecting_;
      n->connect();
    }
  }

  net::EventLoop& loop_;
  std::size_t connecting_limit_;
  std::size_t connecting_ = 0;
  std::size_t welcomed_ = 0;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::deque<Node*> queue_;
  std::set<std::pair<model::JobId, int>> announced_;
  std::chrono::steady_clock::time_point started_;
};

void Node::connect() {
  welcomed_ = false;
  ws_ = std::make_unique<net::WsClient>(
      loop_, options_,
      net::WsClient::Handlers{
          [this] { send(protocol::AgentMessage(hello_)); },
          [this](std::string text) { on_message(text); },
          [this](std::string why) {
            heartbeat_.cancel();
            if (welcomed_) {
              swarm_.left();
            } else {
              swarm_.attempt_ended();
            }
            std::fprintf(stderr, "%s: link closed (%s); again in 1 s\n", name_.c_str(), why.c_str());
            welcomed_ = false;
            // Not from inside the client's own callback: the client is replaced.
            retry_.start(std::chrono::seconds(1), [this] { swarm_.queue(this); });
          }});
  ws_->connect();
}

void Node::on_message(const std::string& text) {
  auto decoded = protocol::decode_coordinator_message(text);
  if (!decoded) {
    std::fprintf(stderr, "%s: undecodable message: %s\n", name_.c_str(), decoded.error().message().c_str());
    return;
  }
  std::visit(
      [this](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, protocol::Welcome>) {
          if (welcomed_) return;
          welcomed_ = true;
          send(protocol::Synced{});
          heartbeat_.start_repeating(std::chrono::milliseconds(m.heartbeat_interval_ms),
                                     [this] { send(protocol::Heartbeat{}); });
          swarm_.welcomed();
          swarm_.attempt_ended();
        } else if constexpr (std::is_same_v<T, protocol::Prepare>) {
          protocol::PrepareResult r;
          r.job = m.job;
          r.attempt = m.attempt;
          r.ok = true;
          r.master_port = m.master_port;
          send(r);
        } else if constexpr (std::is_same_v<T, protocol::Launch>) {
          launch(m);
        } else if constexpr (std::is_same_v<T, protocol::Kill>) {
          end(m.job, m.attempt, 15);
        } else if constexpr (std::is_same_v<T, protocol::LogRequest>) {
          protocol::LogData d;
          d.request = m.request;
          d.offset = m.offset;
          d.finished = !running_.contains({m.job, m.attempt});
          send(d);
        }
        // Reconcile (nothing runs here that it could name), Ack, Inspect, StackRequest: no answer.
      },
      *decoded);
}

void Node::launch(const protocol::Launch& l) {
  swarm_.launched(l.job, l.attempt);
  auto key = std::make_pair(l.job, l.attempt);
  if (running_.contains(key)) return;  // sent again after a reconnect
  Running& r = running_[key];
  for (const auto& rank : l.ranks) r.ranks.push_back(rank.rank);
  auto report_starts = [this, job = l.job, attempt = l.attempt, ranks = r.ranks] {
    for (int rank : ranks) send(protocol::RankStarted{job, attempt, rank, 100000 + rank});
  };
  if (start_delay_ > Duration::zero()) {
    r.started = std::make_unique<net::Timer>(loop_);
    r.started->start(start_delay_, report_starts);
  } else {
    report_starts();
  }
  Duration lasts = run_time(l.command);
  if (lasts == Duration::zero()) {
    end(l.job, l.attempt, 0);
    return;
  }
  r.timer = std::make_unique<net::Timer>(loop_);
  r.timer->start(lasts, [this, job = l.job, attempt = l.attempt] { end(job, attempt, 0); });
}

void Node::end(model::JobId job, int attempt, int signal) {
  auto it = running_.find({job, attempt});
  if (it != running_.end()) {
    for (int rank : it->second.ranks) {
      protocol::RankExited e;
      e.job = job;
      e.attempt = attempt;
      e.rank = rank;
      e.signal = signal;
      e.reason = signal == 0 ? "exited with code 0" : "killed by signal " + std::to_string(signal);
      send(e);
    }
    // Not from inside the timer's own callback: the timer goes with the entry, later.
    loop_.post([this, job, attempt] { running_.erase({job, attempt}); });
  }
  send(protocol::AttemptGone{job, attempt});
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = arg(argc, argv, "--url", "");
  std::string state = arg(argc, argv, "--state-dir", "");
  std::string certs = arg(argc, argv, "--certs", "");
  std::string prefix = arg(argc, argv, "--prefix", "swarm");
  int nodes = std::stoi(arg(argc, argv, "--nodes", "2000"));
  int gpus = std::stoi(arg(argc, argv, "--gpus", "8"));
  int connecting = std::stoi(arg(argc, argv, "--connecting", "32"));
  // Real nodes start their ranks over some time (forks, a slow filesystem): node i reports
  // its ranks started (i * 7919) % S ms after its Launch.
  int spread = std::stoi(arg(argc, argv, "--start-spread-ms", "0"));
  if (url.empty() || state.empty() || certs.empty() || nodes <= 0 || gpus <= 0 || connecting <= 0 || spread < 0) {
    std::fprintf(stderr,
                 "usage: agent_swarm --url https://HOST:PORT --state-dir STATE --certs DIR [--nodes 2000] "
                 "[--gpus 8] [--connecting 32] [--prefix swarm] [--start-spread-ms 0]\n");
    return 2;
  }
  std::filesystem::create_directories(certs);
  net::EventLoop loop;
  Swarm swarm(loop, static_cast<std::size_t>(connecting));
  for (int i = 0; i < nodes; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "%s-%05d", prefix.c_str(), i);
    std::string cert = certs + "/" + name + ".pem";
    std::string key = certs + "/" + name + ".key";
    if (!std::filesystem::exists(cert) || !std::filesystem::exists(key)) {
      net::CertSpec spec{name, {}, false, true};
      if (auto r = net::issue_certificate(state + "/ca.pem", state + "/ca.key", cert, key, spec); !r) {
        std::fprintf(stderr, "agent_swarm: %s\n", r.error().message().c_str());
        return 1;
      }
    }
    net::WsClientOptions options;
    options.url = url;
    options.tls = {state + "/ca.pem", cert, key};
    protocol::Hello hello;
    hello.node = name;
    // Each node its own loopback address (127.0.0.0/8 is all loopback), as real nodes
    // have theirs: master ports are held per address. Nothing connects to it.
    hello.address = "127.1." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    hello.ports = {29500, 29999};
    hello.simulated = true;
    hello.driver = "550.54.15";
    hello.cuda = {12, 4};
    for (int g = 0; g < gpus; ++g) {
      model::Gpu gpu;
      gpu.index = g;
      gpu.uuid = "GPU-" + std::string(name) + "-" + std::to_string(g);
      gpu.cls = {"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"};
      gpu.cuda = {12, 4};
      hello.gpus.push_back(gpu);
    }
    const Duration delay = spread > 0 ? std::chrono::milliseconds((i * 7919) % spread) : Duration::zero();
    swarm.add(std::make_unique<Node>(swarm, loop, name, options, hello, delay));
  }
  loop.on_shutdown_signal([&](int) { loop.stop(); });
  swarm.start();
  loop.run();
  return 0;
}
