#include "cli/keeper.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/core/fd.hpp"
#include "common/core/strings.hpp"
#include "common/core/version.hpp"
#include "common/net/blocking_http.hpp"
#include "common/net/http_client.hpp"
#include "common/net/http_types.hpp"

namespace corral::cli {

namespace {

constexpr std::size_t kMaxBody = 256 * 1024 * 1024;
constexpr std::size_t kMaxIdleClients = 8;  // connections kept to the coordinator
// Commands served at once (each a thread): far more than a person runs (`corral run`,
// `wait` and `logs -f` each hold one for as long as they follow a job), so that a command
// is not left waiting in the listen backlog while its own deadline runs out.
constexpr int kMaxConnections = 512;
// A command's connection idle this long between requests is closed (a command sends its
// next request at once; one stopped, as by Ctrl-Z, must not keep the keeper from ending).
constexpr auto kCommandIdle = std::chrono::seconds(15);
// A kept connection idle longer is let go before use: the coordinator closes one idle for
// 15 s (net::ServerLimits::idle_timeout), and a request is better sent on a new connection
// than on one the coordinator may be closing.
constexpr auto kMaxClientIdle = std::chrono::seconds(10);
// How often the keeper looks whether its coordinator is still there, and how long a look
// may take: a keeper of a coordinator that stopped ends within seconds instead of holding
// a socket that every command tries first until its idle limit.
constexpr auto kProbeEvery = std::chrono::seconds(2);
constexpr auto kProbeLimit = std::chrono::seconds(2);
// A refusal is looked at again after this, before the keeper ends on it.
constexpr auto kProbeConfirm = std::chrono::milliseconds(300);

// `dir` (made mode 0700 when missing) when it is a folder of this user's that no one else
// can enter: nobody else can then place a socket in it or reach one there.
bool private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & 077) == 0;
}

std::uint64_t fnv1a(std::uint64_t h, std::string_view bytes) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// What tells one version of a file from another without reading it: its device, inode,
// size and modification time; empty when it is not there.
std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<std::size_t>(n));
}

enum class Reach { answers, refused, unknown };

// Whether anything listens at `host`:`port`: a TCP connect to each of its addresses, each
// given up after kProbeLimit, and closed at once. Refused means every address refused, or
// the name no longer exists; no answer in time, no route or a resolver that does not
// answer is `unknown`, which may pass.
Reach probe(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc == EAI_NONAME) return Reach::refused;
  if (rc != 0) return Reach::unknown;
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  Reach out = Reach::refused;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      out = Reach::unknown;
      continue;
    }
    int err = ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(kProbeLimit);
      socklen_t len = sizeof(err);
      if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0 ||
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) return Reach::answers;
    if (err != ECONNREFUSED) out = Reach::unknown;
  }
  return out;
}

// Request headers that belong to the hop to the keeper (or that the keeper's client sets
// itself), not to the request relayed.
bool hop_by_hop(const std::string& lower_name) {
  for (const char* name : {"host", "connection", "content-length", "transfer-encoding", "keep-alive", "user-agent",
                           "upgrade", "te", "trailer", "proxy-connection"}) {
    if (lower_name == name) return true;
  }
  return false;
}

class Keeper {
 public:
  Keeper(std::string url, std::string ca, std::string session_file, std::string socket, int idle_seconds)
      : url_(std::move(url)),
        ca_(std::move(ca)),
        session_file_(std::move(session_file)),
        socket_(std::move(socket)),
        idle_(std::chrono::seconds(idle_seconds)) {}

  int run(std::ostream& err) {
    // A keeper that cannot make a TLS client (a CA file that is not there) does not start.
    auto first = make_client();
    if (!first) {
      err << "corral keep-connection: " << first.error().message() << "\n";
      return 1;
    }
    // One keeper a socket: the lock is held for the keeper's life (and dropped with it,
    // however it ends), so a socket file left by a killed keeper is replaced safely.
    lock_.reset(::open((socket_ + ".lock").c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!lock_) {
      err << "corral keep-connection: cannot open " << socket_ << ".lock: " << std::strerror(errno) << "\n";
      return 1;
    }
    if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) return 0;  // another keeper has it
    idle_clients_.push_back({std::move(*first), std::chrono::steady_clock::now()});
    ca_identity_ = file_identity(ca_);
    if (!listen(err)) return 1;
    ::signal(SIGPIPE, SIG_IGN);
    last_used_ = std::chrono::steady_clock::now();
    std::thread watcher;
    if (auto target = net::parse_https_url(url_)) {
      try {
        watcher = std::thread([this, host = target->host, port = target->port] { watch_coordinator(host, port); });
      } catch (const std::exception&) {
        // No thread to spare: the keeper still ends at its idle limit, or at a failed relay.
      }
    }
    serve_until_done();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    watcher_wake_.notify_all();
    if (watcher.joinable()) watcher.join();
    return 0;
  }

 private:
  Result<std::unique_ptr<net::HttpClient>> make_client() {
    return net::HttpClient::create(url_, net::ClientTls{.ca = ca_, .cert = "", .key = "", .session_file = session_file_});
  }

  // Looks every kProbeEvery, on a thread of its own (a name to resolve or a connect to wait
  // for must not hold up accepting commands), whether the coordinator still listens. Two
  // refusals kProbeConfirm apart, with no request relayed in between, end the keeper as a
  // relay that failed does; anything less sure (no answer in time) lets it go on.
  void watch_coordinator(const std::string& host, int port) {
    std::unique_lock lock(mu_);
    const auto stopping = [this] { return stopping_; };
    while (!watcher_wake_.wait_for(lock, kProbeEvery, stopping)) {
      const std::uint64_t relayed = relayed_;
      lock.unlock();
      Reach reach = probe(host, port);
      lock.lock();
      if (reach != Reach::refused || watcher_wake_.wait_for(lock, kProbeConfirm, stopping)) continue;
      lock.unlock();
      reach = probe(host, port);
      lock.lock();
      if (reach == Reach::refused && relayed_ == relayed) {
        coordinator_failed_ = true;
        return;
      }
    }
  }

  bool listen(std::ostream& err) {
    ::unlink(socket_.c_str());
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_.c_str(), socket_.size() + 1);
    mode_t old = ::umask(0177);
    bool bound = listener_ && ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::umask(old);
    if (!bound || ::listen(listener_.get(), 128) != 0) {
      err << "corral keep-connection: cannot listen on " << socket_ << ": " << std::strerror(errno) << "\n";
      return false;
    }
    struct stat st {};
    ::lstat(socket_.c_str(), &st);
    socket_ino_ = st.st_ino;
    return true;
  }

  // Still ours: the socket file at the path is the one this keeper made.
  bool socket_is_ours() const {
    struct stat st {};
    return ::lstat(socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == socket_ino_;
  }

  void serve_until_done() {
    bool ours = true;
    for (;;) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 1000) > 0 && accept_one() == Accepted::out_of_resources) {
        // No descriptor or thread to spare: the command waits in the backlog meanwhile.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      join_finished();
      ours = socket_is_ours();
      // A CA removed or replaced (the cluster renewed, or the folder it was in removed):
      // commands now look for a keeper that verifies with the new one.
      bool ca_same = file_identity(ca_) == ca_identity_;
      std::lock_guard lock(mu_);
      if (!ours || !ca_same || coordinator_failed_) break;
      if (active_ == 0 && std::chrono::steady_clock::now() - last_used_ >= idle_) break;
    }
    // No command finds the socket from now on, and a new keeper may start at once; the
    // commands that reached this one already are served.
    if (ours) ::unlink(socket_.c_str());
    lock_.reset();
    int flags = ::fcntl(listener_.get(), F_GETFL);
    ::fcntl(listener_.get(), F_SETFL, flags | O_NONBLOCK);
    // While commands are being served, the next ending one frees what the waiting ones
    // need; with none, a shortage that is not the keeper's is waited out for 5 s at most.
    for (int idle_tries = 0; idle_tries < 100;) {
      Accepted a = accept_one();
      if (a == Accepted::none_waiting) break;
      if (a == Accepted::out_of_resources) {
        std::unique_lock lock(mu_);
        if (active_ == 0) ++idle_tries;
        done_.wait_for(lock, std::chrono::milliseconds(50));
      }
    }
    listener_.reset();
    {
      std::unique_lock lock(mu_);
      done_.wait(lock, [&] { return active_ == 0; });
    }
    join_finished();
  }

  enum class Accepted { served, none_waiting, out_of_resources };

  // Accepts one waiting command, when the keeper serves fewer than kMaxConnections, and
  // serves it on a thread of its own when it runs as this user.
  Accepted accept_one() {
    {
      // At the limit, commands wait in the listen backlog until one ends.
      std::lock_guard lock(mu_);
      if (active_ >= kMaxConnections) return Accepted::out_of_resources;
    }
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Accepted::none_waiting;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) return Accepted::out_of_resources;
      return Accepted::served;  // that one is gone (ECONNABORTED, EINTR): go on
    }
    UniqueFd conn(fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::geteuid()) {
      return Accepted::served;
    }
    std::lock_guard lock(mu_);
    try {
      auto held = std::make_shared<UniqueFd>(std::move(conn));
      const std::uint64_t id = ++thread_seq_;
      threads_.emplace(id, std::thread([this, held, id] { serve(held->release(), id); }));
      ++active_;
    } catch (const std::exception&) {
      return Accepted::out_of_resources;  // no thread: the connection closes unanswered
    }
    return Accepted::served;
  }

  void serve(int fd, std::uint64_t id) {
    try {
      net::serve_http_blocking(fd, [this](net::HttpRequest& req) { return relay(req); }, kMaxBody, kCommandIdle);
    } catch (const std::exception&) {
      // Out of memory for one command's request: that command gets no answer, the others do.
    }
    std::lock_guard lock(mu_);
    --active_;
    finished_.push_back(id);
    last_used_ = std::chrono::steady_clock::now();
    done_.notify_all();
  }

  void join_finished() {
    std::vector<std::thread> ended;
    {
      std::lock_guard lock(mu_);
      for (std::uint64_t id : finished_) {
        auto it = threads_.find(id);
        ended.push_back(std::move(it->second));
        threads_.erase(it);
      }
      finished_.clear();
    }
    for (auto& t : ended) t.join();
  }

  net::HttpResponse relay(net::HttpRequest& req) {
    std::vector<std::pair<std::string, std::string>> headers;
    for (const auto& [name, value] : req.headers) {
      if (!hop_by_hop(name)) headers.emplace_back(name, value);
    }
    std::unique_ptr<net::HttpClient> client;
    std::vector<std::unique_ptr<net::HttpClient>> stale;  // closed outside the lock
    {
      std::lock_guard lock(mu_);
      auto now = std::chrono::steady_clock::now();
      while (!client && !idle_clients_.empty()) {
        auto kept = std::move(idle_clients_.back());
        idle_clients_.pop_back();
        if (now - kept.since < kMaxClientIdle) client = std::move(kept.client);
        else stale.push_back(std::move(kept.client));
      }
    }
    Result<net::HttpResponse> answer = make_error(ErrorCode::Internal, "");
    if (!client) {
      auto made = make_client();
      if (made) client = std::move(*made);
      else answer = std::unexpected(made.error());
    }
    if (client) answer = client->request(req.method, req.target, req.body, headers);
    if (answer) {
      std::lock_guard lock(mu_);
      ++relayed_;
      if (idle_clients_.size() < kMaxIdleClients) {
        idle_clients_.push_back({std::move(client), std::chrono::steady_clock::now()});
      }
      return std::move(*answer);
    }
    {
      // What could not reach the coordinator now would likely not the next time: the
      // keeper ends, and the next command goes directly (and starts a keeper if it works).
      std::lock_guard lock(mu_);
      coordinator_failed_ = true;
    }
    net::HttpResponse failed;
    failed.status = 502;
    failed.headers.emplace_back(kKeeperErrorHeader, std::string(to_string(answer.error().code())));
    failed.body = nlohmann::json{{"error", answer.error().message()}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return failed;
  }

  std::string url_, ca_, session_file_, socket_;
  UniqueFd lock_;
  std::string ca_identity_;
  std::chrono::steady_clock::duration idle_;
  UniqueFd listener_;
  ino_t socket_ino_ = 0;
  std::mutex mu_;
  std::condition_variable done_;
  struct IdleClient {
    std::unique_ptr<net::HttpClient> client;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<IdleClient> idle_clients_;  // the most recently used last
  int active_ = 0;  // commands' connections being served
  std::map<std::uint64_t, std::thread> threads_;
  std::vector<std::uint64_t> finished_;  // threads that ended, to be joined
  std::uint64_t thread_seq_ = 0;
  std::chrono::steady_clock::time_point last_used_;
  bool coordinator_failed_ = false;  // a relay failed, or the coordinator refuses connections
  std::uint64_t relayed_ = 0;        // requests answered by the coordinator
  bool stopping_ = false;            // the watcher's cue to end
  std::condition_variable watcher_wake_;
};

}  // namespace

KeeperUse keeper_use(const EnvLookup& env) {
  KeeperUse use;
  if (auto v = env_value(env, "CORRAL_KEEP_CONNECTION")) {
    auto seconds = parse_int<int>(*v);
    if (*v == "off" || (seconds && *seconds <= 0)) return use;
    if (seconds) use.idle_seconds = *seconds;
  }
  // A relative XDG_RUNTIME_DIR is to be ignored (the XDG base directory specification).
  if (auto runtime = env_value(env, "XDG_RUNTIME_DIR"); runtime && runtime->starts_with("/")) {
    use.dir = *runtime + "/corral";
  } else {
    use.dir = "/tmp/corral-" + std::to_string(::geteuid());
  }
  use.may_start = !env_value(env, "CORRAL_JOB_ID").has_value();
  return use;
}

std::string keeper_socket(const KeeperUse& use, const ConnectionSettings& settings) {
  if (use.dir.empty() || !settings.url.starts_with("https://")) return {};
  // A CA file replaced (the cluster's CA renewed) names another keeper, one that verifies
  // with the new CA; the old one ends when idle.
  std::string ca = file_identity(settings.ca);
  if (ca.empty()) return {};
  std::uint64_t h = 14695981039346656037ull;
  for (const std::string& part : {settings.url, settings.ca, ca, version()}) {
    h = fnv1a(h, part);
    h = fnv1a(h, std::string_view("\n", 1));
  }
  char name[32];
  std::snprintf(name, sizeof(name), "/keeper-%016llx", static_cast<unsigned long long>(h));
  std::string path = use.dir + name;
  if (path.size() + sizeof(".lock") > sizeof(sockaddr_un{}.sun_path)) return {};
  if (!private_dir(use.dir)) return {};
  return path;
}

void start_keeper(const KeeperUse& use, const ConnectionSettings& settings, const std::string& socket) {
  std::string exe = self_exe();
  if (exe.empty() || socket.empty()) return;
  std::error_code ec;
  auto absolute = [&ec](const std::string& path) { return std::filesystem::absolute(path, ec).string(); };
  std::vector<std::string> args = {exe,     "keep-connection",   "--socket", absolute(socket),
                                   "--url", settings.url,        "--ca",     absolute(settings.ca),
                                   "--idle", std::to_string(use.idle_seconds)};
  if (!settings.session_file.empty()) {
    args.push_back("--session-file");
    args.push_back(absolute(settings.session_file));
  }
  // Not the command's environment (its token, whatever else it holds): only what decides
  // how OpenSSL is set up.
  std::vector<std::string> env;
  for (const char* name : {"OPENSSL_CONF", "OPENSSL_MODULES"}) {
    if (const char* v = std::getenv(name)) env.push_back(std::string(name) + "=" + v);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const long max_fd = std::min(::sysconf(_SC_OPEN_MAX), 65536L);
  pid_t child = ::fork();
  if (child < 0) return;
  if (child == 0) {
    // Its own session, so that the terminal's hangup or Ctrl-C does not reach it, and a
    // grandchild, so that no process waits on it. No descriptor of the command's is kept
    // (a pipe kept open would hold `$(corral ...)` until the keeper ends), nor its folder.
    ::setsid();
    if (::fork() != 0) ::_exit(0);
    int null = ::open("/dev/null", O_RDWR);
    if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(null, 1) < 0 || ::dup2(null, 2) < 0) ::_exit(127);
    if (::close_range(3, ~0u, 0) != 0) {
      for (long fd = 3; fd < max_fd; ++fd) ::close(static_cast<int>(fd));
    }
    if (::chdir("/") != 0) ::_exit(127);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
}

int run_keeper(const std::vector<std::string>& args, std::ostream& err) {
  std::string socket, url, ca, session_file;
  int idle = 600;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size()) {
      err << "corral keep-connection: " << flag << " needs a value\n";
      return 1;
    }
    const std::string& value = args[++i];
    if (flag == "--socket") socket = value;
    else if (flag == "--url") url = value;
    else if (flag == "--ca") ca = value;
    else if (flag == "--session-file") session_file = value;
    else if (flag == "--idle") {
      auto seconds = parse_int<int>(value);
      if (!seconds || *seconds <= 0) {
        err << "corral keep-connection: --idle: not a positive number of seconds: " << value << "\n";
        return 1;
      }
      idle = *seconds;
    } else {
      err << "corral keep-connection: unknown option " << flag << "\n";
      return 1;
    }
  }
  if (socket.empty() || url.empty() || ca.empty()) {
    err << "corral keep-connection: --socket, --url and --ca are required\n";
    return 1;
  }
  if (socket.size() + sizeof(".lock") > sizeof(sockaddr_un{}.sun_path)) {
    err << "corral keep-connection: the socket path is too long: " << socket << "\n";
    return 1;
  }
  return Keeper(url, ca, session_file, socket, idle).run(err);
}

}  // namespace corral::cli
