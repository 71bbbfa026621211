#include "agent/agent.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "agent/launcher.hpp"
#include "agent/rank_env.hpp"
#include "common/protocol/codec.hpp"

namespace corral::agent {

namespace fs = std::filesystem;

namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};

constexpr std::size_t kMaxOutbox = 100000;

// The start time of a process (field 22 of /proc/PID/stat), to tell a pid from a reused one.
std::string process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return {};
  auto close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return {};
}

// Binds the port on the address and listens, so nobody else can take it until rank 0
// starts. -1 and errno EADDRINUSE when someone already holds it.
int probe_port(const std::string& address, int port, std::string& error) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    error = "advertised address " + address + " is not an IP address";
    return -1;
  }
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  // SO_REUSEADDR, as the job's own listener has it (PyTorch's TCPStore, tcp-check): the
  // previous job's connections in TIME_WAIT on this port do not make it busy, a socket
  // listening on it or an outgoing connection bound to it do.
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 1) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    error = "bind " + address + ":" + std::to_string(port) + ": " + std::strerror(err);
    return -1;
  }
  return fd;
}

}  // namespace

Agent::Agent(net::EventLoop& loop, model::AgentConfig config, protocol::Hello node, AgentHooks hooks)
    : loop_(loop), config_(std::move(config)), node_(std::move(node)), hooks_(std::move(hooks)) {
  health_error_ = node_.health_error;
}

Agent::~Agent() { stop(); }

std::size_t Agent::running_ranks() const {
  std::size_t n = 0;
  for (const auto& [key, job] : jobs_) {
    for (const auto& [r, rank] : job.ranks) n += !rank.exited;
  }
  return n;
}

std::string Agent::log_path(model::JobId job, int attempt, int rank) const {
  return config_.spool + "/jobs/" + std::to_string(job) + "/" + std::to_string(attempt) + "/rank-" +
         std::to_string(rank) + ".log";
}

std::string Agent::marker_path(model::JobId job, int attempt, int rank) const {
  return config_.spool + "/running/" + std::to_string(job) + "-" + std::to_string(attempt) + "-" +
         std::to_string(rank);
}

void Agent::kill_orphans() {
  // Ranks an earlier agent process started: nobody watches them any more, and this
  // process cannot wait for them. Kill them, unless the pid was reused since, and report
  // each as ended: a coordinator that did not notice the restart (it took less than
  // node_timeout) still counts them as running, and fails or requeues their job now.
  std::error_code ec;
  fs::create_directories(config_.spool + "/running", ec);
  for (const auto& entry : fs::directory_iterator(config_.spool + "/running", ec)) {
    std::string name = entry.path().filename().string();
    std::ifstream in(entry.path());
    pid_t pid = 0;
    std::string start;
    in >> pid >> start;
    bool alive = pid > 0 && !start.empty() && process_start_time(pid) == start;
    if (alive) {
      spdlog::warn("killing rank process group {} left by an earlier agent ({})", pid, name);
      signal_group(pid, SIGKILL);
    }
    fs::remove(entry.path(), ec);
    long long job = 0;
    int attempt = 0;
    int rank = 0;
    char rest = 0;
    if (std::sscanf(name.c_str(), "%lld-%d-%d%c", &job, &attempt, &rank, &rest) != 3 || job <= 0) continue;
    protocol::RankExited m{job, attempt, rank, 0, 0, "", false};
    if (alive) {
      m.signal = SIGKILL;
      m.reason = "killed by signal 9: left running by an earlier corral-agent process (the agent restarted)";
    } else {
      m.exit_code = -1;
      m.reason = "ended while no corral-agent ran on the node (the agent restarted); exit status unknown";
    }
    send(m);  // queued until the coordinator welcomes us
  }
}

Result<std::string> Agent::load_agent_id() const {
  // Kept in the spool, so that the next agent process finds what this one's ranks left.
  std::string path = config_.spool + "/agent-id";
  std::string id;
  std::ifstream(path) >> id;
  if (id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos) return id;
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  id = buf;
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << id << "\n";
    if (!out.flush()) return make_error(ErrorCode::Unavailable, "cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::Unavailable, "cannot write " + path + ": " + ec.message());
  return id;
}

Result<void> Agent::start() {
  std::error_code ec;
  fs::create_directories(config_.spool + "/jobs", ec);
  if (ec) return make_error(ErrorCode::Unavailable, "cannot create spool " + config_.spool + ": " + ec.message());
  auto id = load_agent_id();
  if (!id) return std::unexpected(id.error());
  agent_id_ = *id;
  kill_orphans();
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  interface_ = interface_for_address(config_.advertise).value_or("");
  if (interface_.empty()) {
    spdlog::warn("no interface holds the advertised address {}; GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are not set",
                 config_.advertise);
  }
  loop_.on_signal(SIGCHLD, [this] { reap(); });
  net::WsClientOptions opts;
  opts.url = config_.coordinator;
  opts.tls = {config_.ca, config_.cert, config_.key};
  ws_ = std::make_unique<net::WsClient>(loop_, opts,
                                        net::WsClient::Handlers{[this] { on_open(); },
                                                                [this](std::string m) { on_message(std::move(m)); },
                                                                [this](std::string why) { on_close(why); }});
  reconnect_timer_ = std::make_unique<net::Timer>(loop_);
  heartbeat_timer_ = std::make_unique<net::Timer>(loop_);
  preflight_timer_ = std::make_unique<net::Timer>(loop_);
  if (hooks_.preflight) preflight_timer_->start_repeating(config_.preflight_interval, [this] { run_preflight(); });
  connect();
  return {};
}

void Agent::stop() {
  if (stopping_) return;
  stopping_ = true;
  if (heartbeat_timer_) heartbeat_timer_->cancel();
  if (reconnect_timer_) reconnect_timer_->cancel();
  if (preflight_timer_) preflight_timer_->cancel();
  if (ws_) ws_->close();
}

void Agent::connect() {
  if (stopping_) return;
  welcomed_ = false;
  ws_->connect();
}

void Agent::on_open() {
  backoff_ = std::chrono::milliseconds(100);
  protocol::Hello hello = node_;
  hello.health_error = health_error_;
  hello.running.clear();
  for (const auto& [key, job] : jobs_) {
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.exited) hello.running.push_back({key.first, key.second, r, rank.pid});
    }
  }
  ws_->send(protocol::encode(protocol::AgentMessage(hello)));
  spdlog::info("connected to {}; said hello with {} running rank(s)", config_.coordinator, hello.running.size());
}

void Agent::on_close(const std::string& reason) {
  welcomed_ = false;
  // What the coordinator did not acknowledge may not have reached it: send it again,
  // first, on the next connection.
  outbox_.insert(outbox_.begin(), unacked_.begin(), unacked_.end());
  unacked_.clear();
  acked_ = 0;
  heartbeat_timer_->cancel();
  if (stopping_) return;
  // Back off with jitter so a restarted coordinator is not hit by every agent at once.
  static thread_local std::mt19937 rng(std::random_device{}());
  auto jitter = std::uniform_int_distribution<long>(0, backoff_.count() / 2)(rng);
  Duration wait = backoff_ + Duration(jitter);
  spdlog::warn("link to the coordinator down ({}); retrying in {} ms", reason, wait.count());
  backoff_ = std::min<Duration>(backoff_ * 2, config_.reconnect_max_backoff);
  reconnect_timer_->start(wait, [this] { connect(); });
}

void Agent::send(const protocol::AgentMessage& message) {
  std::string text = protocol::encode(message);
  // Reports must reach the coordinator across outages and its restarts: kept until it
  // acknowledges them. Heartbeats, log data and Synced only matter on this connection.
  bool report = protocol::is_report(message);
  if (welcomed_ && ws_->open()) {
    if (report) unacked_.push_back(text);
    ws_->send(std::move(text));
    return;
  }
  if (!report) return;
  if (outbox_.size() >= kMaxOutbox) outbox_.pop_front();
  outbox_.push_back(std::move(text));
}

void Agent::flush_outbox() {
  while (!outbox_.empty() && ws_->open()) {
    unacked_.push_back(outbox_.front());
    ws_->send(std::move(outbox_.front()));
    outbox_.pop_front();
  }
}

void Agent::on_ack(const protocol::Ack& m) {
  while (acked_ < m.received && !unacked_.empty()) {
    unacked_.pop_front();
    ++acked_;
  }
}

void Agent::on_message(std::string text) {
  auto decoded = protocol::decode_coordinator_message(text);
  if (!decoded) {
    spdlog::warn("bad message from the coordinator: {}", decoded.error().message());
    return;
  }
  std::visit(Overloaded{[this](const protocol::Welcome& m) { on_welcome(m); },
                        [this](const protocol::Reconcile& m) { on_reconcile(m); },
                        [this](const protocol::Prepare& m) { on_prepare(m); },
                        [this](const protocol::Launch& m) { on_launch(m); },
                        [this](const protocol::Kill& m) { on_kill(m); },
                        [this](const protocol::LogRequest& m) { on_log_request(m); },
                        [this](const protocol::Ack& m) { on_ack(m); }},
             *decoded);
}

void Agent::on_welcome(const protocol::Welcome& m) {
  welcomed_ = true;
  heartbeat_interval_ = std::chrono::milliseconds(m.heartbeat_interval_ms);
  spdlog::info("welcomed by the coordinator; heartbeat every {} ms, {} message(s) held back to send",
               m.heartbeat_interval_ms, outbox_.size());
  heartbeat_timer_->start_repeating(heartbeat_interval_, [this] { send(protocol::Heartbeat{}); });
  flush_outbox();
  // Everything held back is on its way: the coordinator may now judge what we do not run.
  send(protocol::Synced{});
}

void Agent::on_reconcile(const protocol::Reconcile& m) {
  std::vector<Key> orphaned;
  for (const auto& [key, job] : jobs_) {
    if (job.killing) continue;
    bool keep = std::find(m.keep.begin(), m.keep.end(), key) != m.keep.end();
    bool running = std::any_of(job.ranks.begin(), job.ranks.end(), [](const auto& r) { return !r.second.exited; });
    if (!keep && (running || job.nccl_root != 0 || job.probe_fd >= 0)) orphaned.push_back(key);
  }
  for (const auto& key : orphaned) {
    spdlog::warn("job {} attempt {} is no longer running on the coordinator: killing its ranks", key.first, key.second);
    kill_job(key, std::chrono::milliseconds(0));
  }
}

void Agent::on_prepare(const protocol::Prepare& m) {
  Key key{m.job, m.attempt};
  if (std::find(finished_.begin(), finished_.end(), key) != finished_.end()) return;  // over here
  if (auto it = jobs_.find(key); it != jobs_.end() && (!it->second.ranks.empty() || it->second.killing)) {
    return;  // launched already: a Prepare sent again after a reconnect changes nothing
  }
  Job& job = jobs_[key];
  protocol::PrepareResult result{m.job, m.attempt, false, false, "", "", m.master_port};
  // Sent again (the first answer may have been lost): start over.
  release_job_resources(job);
  std::string error;
  job.probe_fd = probe_port(m.master_addr, m.master_port, error);
  if (job.probe_fd < 0) {
    result.port_busy = errno == EADDRINUSE;
    result.error = error;
    send(result);
    jobs_.erase(key);
    return;
  }
  if (m.nccl) {
    // ncclGetUniqueId opens the bootstrap root's socket in the calling process, which
    // must outlive the job's init: a child of ours, killed with the job.
    int out[2];
    int in[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(in, O_CLOEXEC) != 0) {
      result.error = std::string("pipe: ") + std::strerror(errno);
      send(result);
      return;
    }
    std::error_code ec;
    fs::create_directories(config_.spool + "/jobs/" + std::to_string(m.job) + "/" + std::to_string(m.attempt), ec);
    ProcessSpec spec;
    spec.argv = {config_.worker, "nccl-root"};
    spec.envp = {"PATH=" + std::string(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin")};
    if (!interface_.empty()) spec.envp.push_back("NCCL_SOCKET_IFNAME=" + interface_);
    spec.log_path = config_.spool + "/jobs/" + std::to_string(m.job) + "/" + std::to_string(m.attempt) + "/nccl-root.log";
    spec.stdout_fd = out[1];
    spec.stdin_fd = in[0];
    auto pid = spawn(spec);
    ::close(out[1]);
    ::close(in[0]);
    if (!pid) {
      ::close(out[0]);
      ::close(in[1]);
      result.error = "cannot start nccl-root: " + pid.error().message();
      send(result);
      return;
    }
    job.nccl_root = *pid;
    job.nccl_root_stdin = in[1];
    // The ID comes within milliseconds; bound the wait in case the child hangs.
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    char buf[512];
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      if (::poll(&p, 1, std::max(left, 0)) <= 0) break;
      ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    auto nl = line.find('\n');
    std::string id = nl == std::string::npos ? "" : line.substr(0, nl);
    if (id.size() != 256 || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
      std::ifstream log(spec.log_path);
      std::string why;
      std::getline(log, why);
      result.error = "nccl-root gave no unique ID" + (why.empty() ? std::string() : ": " + why);
      send(result);
      release_job_resources(job);
      jobs_.erase(key);
      return;
    }
    result.nccl_id = id;
  }
  result.ok = true;
  send(result);
}

void Agent::launch_failed(const protocol::Launch& m, const std::string& reason) {
  spdlog::warn("job {} attempt {} cannot start here: {}", m.job, m.attempt, reason);
  for (const auto& r : m.ranks) {
    send(protocol::RankExited{m.job, m.attempt, r.rank, 127, 0, reason, true});
  }
}

void Agent::on_launch(const protocol::Launch& m) {
  Key key{m.job, m.attempt};
  if (std::find(finished_.begin(), finished_.end(), key) != finished_.end()) {
    spdlog::warn("job {} attempt {} already ended on this node: not starting it again", m.job, m.attempt);
    return;
  }
  Job& job = jobs_[key];
  if (!job.ranks.empty() || job.killing) return;  // a repeat after a reconnect
  std::optional<UserIds> user;
  if (::geteuid() == 0) {
    auto u = lookup_user(m.user);
    if (!u) return launch_failed(m, u.error().message());
    if (u->uid == 0 && !config_.allow_root_jobs) {
      return launch_failed(m, "jobs as root are refused on this node (allow_root_jobs: false)");
    }
    if (u->uid != 0) user = *u;
  }
  std::error_code ec;
  std::string dir = config_.spool + "/jobs/" + std::to_string(m.job) + "/" + std::to_string(m.attempt);
  fs::create_directories(dir, ec);
  if (ec) return launch_failed(m, "cannot create " + dir + ": " + ec.message());
  // A clean login-like environment, never the agent's own: the job's exported
  // environment and env come on top of it (build_rank_env).
  std::optional<UserIds> account = user;
  if (!account) {
    if (auto self = lookup_user_id(::geteuid())) account = *self;
  }
  Env base;
  base.emplace_back("PATH", kLoginPath);
  if (account) {
    base.emplace_back("HOME", account->home);
    base.emplace_back("USER", account->name);
    base.emplace_back("LOGNAME", account->name);
    base.emplace_back("SHELL", account->shell);
  }
  auto ranks = m.ranks;
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (const auto& r : ranks) {
    if (std::string log = log_path(m.job, m.attempt, r.rank); fs::exists(log)) {
      // This rank was started here before, by this agent process or an earlier one (a
      // Launch sent again after the coordinator lost our reports): never twice. Say how
      // it ended, as far as the spool knows.
      send(ended_before(m.job, m.attempt, r.rank));
      continue;
    }
    ProcessSpec spec;
    spec.argv = m.command.shell ? std::vector<std::string>{"/bin/sh", "-c", m.command.argv.front()} : m.command.argv;
    if (m.command.shell) spec.require_program = shell_program(m.command.argv.front());
    Env env = build_rank_env(m, r, {interface_}, base);
    env.emplace_back(kAgentIdVariable, agent_id_);
    spec.envp = to_envp(env);
    spec.workdir = m.workdir;
    if (account) spec.home = account->home;
    spec.user = user;
    spec.log_path = log_path(m.job, m.attempt, r.rank);
    if (r.rank == 0 && job.probe_fd >= 0) {
      // Rank 0 binds the master port itself now.
      ::close(job.probe_fd);
      job.probe_fd = -1;
    }
    auto pid = spawn(spec);
    if (!pid) {
      // A bad workdir or command fails every rank alike: report it as the launch failure.
      send(protocol::RankExited{m.job, m.attempt, r.rank, 127, 0,
                                "cannot start as user " + (user ? user->name : m.user) + ": " + pid.error().message(),
                                true});
      continue;
    }
    Rank rank{r.rank, *pid, false, spec.log_path, r.gpus};
    job.gpus.insert(job.gpus.end(), r.gpus.begin(), r.gpus.end());
    job.ranks[r.rank] = rank;
    std::ofstream(marker_path(m.job, m.attempt, r.rank)) << *pid << " " << process_start_time(*pid) << "\n";
    send(protocol::RankStarted{m.job, m.attempt, r.rank, *pid});
  }
  if (job.ranks.empty()) {
    // None started (launch failures, or ranks started here before): confirm that nothing
    // of the attempt runs here, as for an attempt whose ranks ended.
    job.killing = true;
    finish_kill(key);
    return;
  }
  // A rank may have exited before we recorded it.
  reap();
}

void Agent::reap() {
  // The agent is a child subreaper: ranks' orphaned children come back to it and are
  // reaped here too, so no zombie lingers in a job's process group.
  std::map<pid_t, std::pair<Key, int>> ranks;
  for (auto& [key, job] : jobs_) {
    for (auto& [r, rank] : job.ranks) {
      if (!rank.exited) ranks[rank.pid] = {key, r};
    }
  }
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    if (auto it = ranks.find(pid); it != ranks.end()) {
      auto job = jobs_.find(it->second.first);
      if (job != jobs_.end()) rank_done(it->second.first, job->second.ranks[it->second.second], status);
      continue;
    }
    for (auto& [key, job] : jobs_) {
      if (job.nccl_root == pid) job.nccl_root = 0;
    }
  }
}

protocol::RankExited Agent::ended_before(model::JobId job, int attempt, int rank) const {
  protocol::RankExited m{job, attempt, rank, -1, 0,
                         "started on this node before and not running now; its end is unknown (the agent restarted)",
                         false};
  std::ifstream in(log_path(job, attempt, rank) + ".exit");
  int code = 0;
  int signal = 0;
  if (in >> code >> signal) {
    m.exit_code = code;
    m.signal = signal;
    std::getline(in >> std::ws, m.reason);
  }
  return m;
}

void Agent::rank_done(const Key& key, Rank& rank, int status) {
  rank.exited = true;
  // Whatever the rank left behind in its group (data loader workers, shells) goes too.
  signal_group(rank.pid, SIGKILL);
  std::error_code ec;
  fs::remove(marker_path(key.first, key.second, rank.rank), ec);
  protocol::RankExited m{key.first, key.second, rank.rank, 0, 0, describe_status(status), false};
  if (WIFEXITED(status)) m.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) m.signal = WTERMSIG(status);
  // Kept beside the log: an agent restarted before this report was acknowledged can
  // still say how the rank ended.
  std::ofstream(rank.log + ".exit") << m.exit_code << " " << m.signal << "\n" << m.reason << "\n";
  spdlog::info("job {} rank {} {}", key.first, rank.rank, m.reason);
  send(m);
  Job& job = jobs_[key];
  bool all = std::all_of(job.ranks.begin(), job.ranks.end(), [](const auto& r) { return r.second.exited; });
  if (all) {
    if (job.kill_timer) job.kill_timer->cancel();
    // Whether they ended by themselves or were killed: make sure nothing of the attempt is
    // left on the node, then say so (AttemptGone), which frees its GPUs and port.
    job.killing = true;
    finish_kill(key);
  }
}

void Agent::release_job_resources(Job& job) {
  if (job.probe_fd >= 0) {
    ::close(job.probe_fd);
    job.probe_fd = -1;
  }
  if (job.nccl_root_stdin >= 0) {
    ::close(job.nccl_root_stdin);
    job.nccl_root_stdin = -1;
  }
  if (job.nccl_root != 0) {
    signal_group(job.nccl_root, SIGTERM);
    int status = 0;
    // nccl-root exits at once on SIGTERM or stdin EOF; do not leave a zombie.
    for (int i = 0; i < 100 && ::waitpid(job.nccl_root, &status, WNOHANG) == 0; ++i) {
      pollfd none{-1, 0, 0};
      ::poll(&none, 0, 10);
    }
    signal_group(job.nccl_root, SIGKILL);
    ::waitpid(job.nccl_root, &status, WNOHANG);
    job.nccl_root = 0;
  }
}

void Agent::on_kill(const protocol::Kill& m) {
  Key key{m.job, m.attempt};
  if (!jobs_.contains(key)) {
    // Never run here, already ended, or left by an earlier agent process: look for what
    // may be left of it all the same, and answer.
    jobs_[key].killing = true;
    finish_kill(key);
    return;
  }
  kill_job(key, std::chrono::milliseconds(m.grace_ms));
}

void Agent::kill_job(const Key& key, Duration grace) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.killing) return;
  job.killing = true;
  bool any = false;
  for (auto& [r, rank] : job.ranks) {
    if (!rank.exited) any = signal_group(rank.pid, grace.count() > 0 ? SIGTERM : SIGKILL) || any;
  }
  if (!any) {
    finish_kill(key);
    return;
  }
  // No grace: SIGKILL went out already, and each rank's reaping finishes the kill. A timer
  // would only report that ranks "ignored SIGTERM" that was never sent.
  if (grace.count() <= 0) return;
  job.kill_timer = std::make_unique<net::Timer>(loop_);
  job.kill_timer->start(grace, [this, key] {
    auto j = jobs_.find(key);
    if (j == jobs_.end()) return;
    for (auto& [r, rank] : j->second.ranks) {
      if (!rank.exited) {
        spdlog::warn("job {} rank {} ignored SIGTERM for the grace period: SIGKILL", key.first, r);
        signal_group(rank.pid, SIGKILL);
      }
    }
  });
}

void Agent::finish_kill(const Key& key) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  release_job_resources(it->second);
  verify_gone(key, 0);
}

void Agent::verify_gone(const Key& key, int tries) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  reap();
  // Nothing of the attempt may be left: every rank's process group is empty, and no
  // process carries its CORRAL_JOB_ID and CORRAL_ATTEMPT (one that left its group by
  // setsid or a double fork is found that way).
  std::string left;
  for (auto& [r, rank] : job.ranks) {
    if (group_alive(rank.pid)) {
      signal_group(rank.pid, SIGKILL);
      left += (left.empty() ? "" : ", ") + std::string("group ") + std::to_string(rank.pid);
    }
  }
  for (pid_t pid : attempt_processes(key.first, key.second, agent_id_)) {
    ::kill(pid, SIGKILL);
    left += (left.empty() ? "" : ", ") + std::string("pid ") + std::to_string(pid);
  }
  if (!left.empty() && tries < 40) {
    // SIGKILL is delivered asynchronously: look again shortly.
    job.kill_timer = std::make_unique<net::Timer>(loop_);
    job.kill_timer->start(std::chrono::milliseconds(tries == 0 ? 5 : 50), [this, key, tries] { verify_gone(key, tries + 1); });
    return;
  }
  if (!left.empty()) {
    // Not confirmed: the coordinator keeps the attempt's GPUs and port fenced.
    health_error_ = "processes of job " + std::to_string(key.first) + " survived SIGKILL (" + left + ")";
    spdlog::error("{}", health_error_);
    send(protocol::Health{health_error_});
    remember_finished(key);
    jobs_.erase(it);
    return;
  }
  if (hooks_.gpus_still_held && !job.gpus.empty()) {
    std::vector<std::string> uuids;
    for (int g : job.gpus) {
      for (const auto& gpu : node_.gpus) {
        if (gpu.index == g) uuids.push_back(gpu.uuid);
      }
    }
    auto held = hooks_.gpus_still_held(uuids);
    if (!held.empty()) {
      std::string what;
      for (const auto& h : held) what += (what.empty() ? "" : "; ") + h;
      health_error_ = "GPU still in use after job " + std::to_string(key.first) + " was killed: " + what;
      spdlog::error("{}", health_error_);
      send(protocol::Health{health_error_});
    }
  }
  remember_finished(key);
  jobs_.erase(it);
  send(protocol::AttemptGone{key.first, key.second});
}

void Agent::remember_finished(const Key& key) {
  // A Launch that arrives after its attempt ended here (repeated, or overtaken by a Kill)
  // must not start it again. Attempts end at most a few per second: a window of recent
  // ones is enough.
  constexpr std::size_t kRemembered = 4096;
  if (std::find(finished_.begin(), finished_.end(), key) != finished_.end()) return;
  finished_.push_back(key);
  if (finished_.size() > kRemembered) finished_.pop_front();
}

void Agent::on_log_request(const protocol::LogRequest& m) {
  protocol::LogData d;
  d.request = m.request;
  d.offset = m.offset;
  std::string path = log_path(m.job, m.attempt, m.rank);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    d.error = "no log for job " + std::to_string(m.job) + " rank " + std::to_string(m.rank) + " on this node";
    send(d);
    return;
  }
  struct stat st{};
  ::fstat(fd, &st);
  d.size = static_cast<std::uint64_t>(st.st_size);
  if (m.offset < d.size) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>({m.max_bytes, d.size - m.offset, 1 << 20}));
    d.data.resize(want);
    ssize_t n = ::pread(fd, d.data.data(), want, static_cast<off_t>(m.offset));
    d.data.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  }
  ::close(fd);
  auto it = jobs_.find({m.job, m.attempt});
  bool running = it != jobs_.end() && it->second.ranks.contains(m.rank) && !it->second.ranks.at(m.rank).exited;
  d.finished = !running;
  send(d);
}

void Agent::run_preflight() {
  std::string error = hooks_.preflight();
  if (error == health_error_) return;
  health_error_ = error;
  send(protocol::Health{error});
}

}  // namespace corral::agent
