#include "worker/tcp_rendezvous.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/core/fd.hpp"
#include "common/core/strings.hpp"
#include "worker/rendezvous_wire.hpp"

namespace corral::worker {

namespace {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

// A SYN to a black-holed address can hang for minutes; a slice this long lets a peer
// notice a rank 0 that came up on another of MASTER_ADDR's addresses meanwhile.
constexpr int kConnectSliceMs = 5000;
constexpr auto kFirstBackoff = std::chrono::milliseconds(25);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);
// Connections that have not said hello yet. Bounded so that a port scanner or a stuck
// client cannot exhaust rank 0's descriptors; the oldest is dropped first.
constexpr std::size_t kMaxPendingExtra = 64;

using Fd = UniqueFd;

int ms_left(Deadline deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, INT_MAX));
}

std::string errno_text(int err) {
  return std::strerror(err);
}

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

std::string describe(const sockaddr* sa, socklen_t length) {
  char host[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (::getnameinfo(sa, length, host, sizeof(host), service, sizeof(service),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  std::string h(host);
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + service;
}

std::string master_text(const std::string& addr, int port) {
  return (addr.find(':') != std::string::npos ? "[" + addr + "]" : addr) + ":" + std::to_string(port);
}

Result<std::vector<Address>> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    return make_error(ErrorCode::NotFound, "cannot resolve MASTER_ADDR=" + host + ": " + ::gai_strerror(rc));
  }
  std::vector<Address> out;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Address address;
    std::memcpy(&address.storage, a->ai_addr, a->ai_addrlen);
    address.length = a->ai_addrlen;
    address.family = a->ai_family;
    out.push_back(address);
  }
  ::freeaddrinfo(list);
  if (out.empty()) return make_error(ErrorCode::NotFound, "MASTER_ADDR=" + host + " has no address");
  return out;
}

Result<void> send_all(int fd, std::string_view data, Deadline deadline) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int left = ms_left(deadline);
      if (left == 0) return make_error(ErrorCode::Timeout, "send timed out");
      if (::poll(&p, 1, left) < 0 && errno != EINTR) {
        return make_error(ErrorCode::Internal, "poll: " + errno_text(errno));
      }
      continue;
    }
    return make_error(ErrorCode::Unavailable, errno_text(errno));
  }
  return {};
}

// A peer's wait for rank 0's one-line answer.
struct LineRead {
  enum class Kind { Line, Closed, TimedOut, TooLong };
  Kind kind = Kind::Closed;
  std::string text;  // Line: without '\n'; Closed: why
};

LineRead read_line(int fd, Deadline deadline) {
  std::string buffer;
  for (;;) {
    if (auto nl = buffer.find('\n'); nl != std::string::npos) {
      return {LineRead::Kind::Line, buffer.substr(0, nl)};
    }
    if (buffer.size() >= kMaxLineBytes) return {LineRead::Kind::TooLong, {}};
    pollfd p{fd, POLLIN, 0};
    int left = ms_left(deadline);
    int rc = left == 0 ? 0 : ::poll(&p, 1, left);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return {LineRead::Kind::Closed, "poll: " + errno_text(errno)};
    if (rc == 0) return {LineRead::Kind::TimedOut, {}};
    char chunk[256];
    std::size_t want = std::min(sizeof(chunk), kMaxLineBytes - buffer.size());
    ssize_t n = ::recv(fd, chunk, want, 0);
    if (n > 0) {
      buffer.append(chunk, static_cast<std::size_t>(n));
    } else if (n == 0) {
      return {LineRead::Kind::Closed, "closed the connection"};
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return {LineRead::Kind::Closed, errno_text(errno)};
    }
  }
}

Result<Fd> connect_to(const Address& address, Deadline deadline) {
  Fd fd(::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(ErrorCode::Internal, "socket: " + errno_text(errno));
  if (::connect(fd.get(), address.get(), address.length) == 0) return fd;
  if (errno != EINPROGRESS && errno != EINTR) return make_error(ErrorCode::Unavailable, errno_text(errno));
  pollfd p{fd.get(), POLLOUT, 0};
  int rc = 0;
  do {
    rc = ::poll(&p, 1, std::min(ms_left(deadline), kConnectSliceMs));
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return make_error(ErrorCode::Internal, "poll: " + errno_text(errno));
  if (rc == 0) return make_error(ErrorCode::Timeout, "connect timed out");
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return make_error(ErrorCode::Unavailable, errno_text(err));
  return fd;
}

// True unless the other side has closed or reset: a rank whose first connection died
// may come back, and must not then be taken for a second process claiming its rank.
bool still_connected(int fd) {
  char c = 0;
  ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

// Room for one socket per rank; the soft limit is often 1024.
void raise_descriptor_limit(std::size_t needed) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= needed) return;
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, needed);
  ::setrlimit(RLIMIT_NOFILE, &lim);
}

// Rank 0: one listener, connections that have not said hello, and the ranks that have.
class Root {
 public:
  Root(const RankEnv& env, std::int64_t value, const RendezvousOptions& options, Deadline deadline)
      : env_(env), value_(value), options_(options), deadline_(deadline) {}

  Result<RendezvousResult> run() {
    if (auto listening = listen(); !listening) return std::unexpected(listening.error());
    const auto expected = static_cast<std::size_t>(env_.world_size - 1);
    while (ranks_.size() < expected) {
      if (ms_left(deadline_) == 0) return fail_all(timeout_error(), Reply::Kind::TimedOut);
      std::vector<pollfd> fds;
      fds.push_back({listener_.get(), POLLIN, 0});
      for (const Peer& p : pending_) fds.push_back({p.fd.get(), POLLIN, 0});
      std::vector<int> polled_ranks;
      for (const auto& [rank, p] : ranks_) {
        fds.push_back({p.fd.get(), POLLIN, 0});
        polled_ranks.push_back(rank);
      }
      int rc = ::poll(fds.data(), fds.size(), ms_left(deadline_));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0)
        return fail_all(Error(ErrorCode::Internal, "poll: " + errno_text(errno)), Reply::Kind::Refused);
      if (rc == 0) continue;
      // Registered ranks first, then hellos from the back, then new connections, so that
      // each index into `fds` still names the peer it was built from.
      const std::size_t first_rank_fd = 1 + pending_.size();
      for (std::size_t i = 0; i < polled_ranks.size(); ++i) {
        if (fds[first_rank_fd + i].revents != 0) check_registered(polled_ranks[i]);
      }
      for (std::size_t i = pending_.size(); i-- > 0;) {
        if (fds[1 + i].revents == 0) continue;
        if (auto ok = read_pending(i); !ok) return std::unexpected(ok.error());
      }
      if (fds[0].revents != 0) {
        if (auto ok = accept_all(); !ok) return fail_all(ok.error(), Reply::Kind::Refused);
      }
    }
    return release();
  }

 private:
  struct Peer {
    Fd fd;
    std::string from;
    std::string buffer;
    Hello hello;
  };

  void log(const std::string& message) const {
    if (options_.log) options_.log(message);
  }

  std::string master() const { return master_text(env_.master_addr, env_.master_port); }

  Result<void> listen() {
    auto addresses = resolve(env_.master_addr, env_.master_port);
    if (!addresses) return std::unexpected(addresses.error());
    // The first address, exactly: binding a wildcard instead would accept ranks that
    // were told another address and hide a wrong MASTER_ADDR.
    const Address& address = addresses->front();
    listener_ = Fd(::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!listener_) return make_error(ErrorCode::Internal, "socket: " + errno_text(errno));
    int one = 1;
    // A previous attempt's connections in TIME_WAIT must not keep this one off its port;
    // a live listener still does, which is what proves the port is ours.
    ::setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listener_.get(), address.get(), address.length) != 0 ||
        ::listen(listener_.get(), std::min(env_.world_size, SOMAXCONN)) != 0) {
      int err = errno;
      std::string why = errno_text(err);
      if (err == EADDRINUSE) why += " (another process holds the port)";
      if (err == EADDRNOTAVAIL) why += " (the address is not one of this host's)";
      return make_error(ErrorCode::Unavailable, "cannot listen on " +
                                                    describe(address.get(), address.length) +
                                                    " (MASTER_ADDR=" + env_.master_addr + "): " + why);
    }
    raise_descriptor_limit(static_cast<std::size_t>(env_.world_size) + kMaxPendingExtra + 32);
    log("listening on " + describe(address.get(), address.length) + " for " +
        std::to_string(env_.world_size - 1) + " other rank" + (env_.world_size == 2 ? "" : "s"));
    return {};
  }

  Result<void> accept_all() {
    for (;;) {
      sockaddr_storage from{};
      socklen_t len = sizeof(from);
      int fd =
          ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        return make_error(ErrorCode::Internal, "accept: " + errno_text(errno));
      }
      if (pending_.size() >= static_cast<std::size_t>(env_.world_size) + kMaxPendingExtra) {
        log("dropped a connection from " + pending_.front().from +
            " that sent no hello: too many connections");
        pending_.erase(pending_.begin());
      }
      pending_.push_back(Peer{Fd(fd), describe(reinterpret_cast<sockaddr*>(&from), len), {}, {}});
    }
  }

  // A registered rank sends nothing more, so readable means gone (or misbehaving).
  void check_registered(int rank) {
    auto it = ranks_.find(rank);
    if (it == ranks_.end()) return;
    char c = 0;
    ssize_t n = ::recv(it->second.fd.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    log("rank " + std::to_string(rank) + " (from " + it->second.from + ") " +
        (n > 0 ? "sent more than its hello; dropped it"
               : "went away before the barrier; waiting for it again"));
    ranks_.erase(it);
  }

  Result<void> read_pending(std::size_t index) {
    Peer& peer = pending_[index];
    char chunk[256];
    std::size_t want = std::min(sizeof(chunk), kMaxLineBytes - peer.buffer.size());
    ssize_t n = ::recv(peer.fd.get(), chunk, want, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return {};
    if (n <= 0) {
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
      return {};
    }
    peer.buffer.append(chunk, static_cast<std::size_t>(n));
    auto nl = peer.buffer.find('\n');
    if (nl == std::string::npos && peer.buffer.size() < kMaxLineBytes) return {};
    Peer taken = std::move(peer);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
    if (nl == std::string::npos) {
      refuse(taken, "hello longer than " + std::to_string(kMaxLineBytes) + " bytes");
      return {};
    }
    std::string line = taken.buffer.substr(0, nl);
    return on_hello(std::move(taken), line);
  }

  // Refuses one connection without failing the job: it is not one of this job's ranks.
  void refuse(Peer& peer, const std::string& why_for_peer, const std::string& why_for_log = {}) {
    ++refused_;
    log("refused " +
        (why_for_log.empty() ? "a connection from " + peer.from + ": " + why_for_peer : why_for_log));
    (void)send_all(peer.fd.get(), format_reply({Reply::Kind::Refused, 0, why_for_peer}),
                   SteadyClock::now() + std::chrono::seconds(1));
  }

  Result<void> on_hello(Peer peer, std::string_view line) {
    auto hello = parse_hello(line);
    if (!hello) {
      refuse(peer, hello.error().message());
      return {};
    }
    const Hello& h = *hello;
    if (h.job_id != env_.job_id || h.attempt != env_.attempt) {
      // Another job (or a stale attempt) was given this port: the pitfall where two
      // jobs quietly form one group. Turn it away; this job's own ranks may still come.
      std::string ours = "job " + std::to_string(env_.job_id) + " attempt " + std::to_string(env_.attempt);
      std::string theirs = "job " + std::to_string(h.job_id) + " attempt " + std::to_string(h.attempt);
      refuse(peer,
             "this is the rendezvous of " + ours + ", not of " + theirs + ": two jobs were given one port",
             "rank " + std::to_string(h.rank) + " of " + theirs + " from " + peer.from + ": this is " + ours +
                 "'s rendezvous; two jobs were given port " + std::to_string(env_.master_port));
      return {};
    }
    std::string rank = "rank " + std::to_string(h.rank);
    std::string conflict;
    if (h.world_size != env_.world_size) {
      conflict = rank + " has WORLD_SIZE=" + std::to_string(h.world_size) +
                 " but rank 0 has WORLD_SIZE=" + std::to_string(env_.world_size);
    } else if (h.master_addr != env_.master_addr || h.master_port != env_.master_port) {
      conflict = rank + " was given MASTER_ADDR:MASTER_PORT " + master_text(h.master_addr, h.master_port) +
                 " but rank 0 was given " + master();
    } else if (h.rank == 0) {
      conflict = "a second process (from " + peer.from + ") claims rank 0";
    } else if (h.rank >= env_.world_size) {
      conflict = rank + " is outside WORLD_SIZE=" + std::to_string(env_.world_size);
    } else if (auto it = ranks_.find(h.rank); it != ranks_.end()) {
      if (still_connected(it->second.fd.get())) {
        conflict = rank + " is claimed twice, from " + it->second.from + " and from " + peer.from;
      } else {
        log(rank + " reconnected from " + peer.from);
        ranks_.erase(it);
      }
    }
    if (!conflict.empty()) {
      pending_.push_back(std::move(peer));
      return fail_all(Error(ErrorCode::Conflict, conflict), Reply::Kind::Refused);
    }
    peer.hello = h;
    ranks_.emplace(h.rank, std::move(peer));
    return {};
  }

  Error timeout_error() const {
    std::string missing;
    int shown = 0;
    int absent = 0;
    for (int r = 1; r < env_.world_size; ++r) {
      if (ranks_.contains(r)) continue;
      ++absent;
      if (shown < 16) {
        missing += (shown == 0 ? "" : ", ") + std::to_string(r);
        ++shown;
      }
    }
    if (absent > shown) missing += " and " + std::to_string(absent - shown) + " more";
    return Error(ErrorCode::Timeout, "timed out after " + format_duration(options_.timeout) + " at " +
                                         master() + " waiting for rank" + (absent == 1 ? " " : "s ") +
                                         missing + " (" + std::to_string(env_.world_size - absent) + " of " +
                                         std::to_string(env_.world_size) + " arrived)");
  }

  // Tells every connected rank why the rendezvous failed, so none waits out its own
  // deadline for a barrier that will not be released.
  std::unexpected<Error> fail_all(Error error, Reply::Kind kind) {
    std::string line = format_reply({kind, 0, error.message()});
    auto deadline = SteadyClock::now() + std::chrono::seconds(1);
    for (auto& [r, peer] : ranks_) (void)send_all(peer.fd.get(), line, deadline);
    for (auto& peer : pending_) (void)send_all(peer.fd.get(), line, deadline);
    return std::unexpected(std::move(error));
  }

  Result<RendezvousResult> release() {
    std::int64_t sum = value_;
    for (const auto& [r, peer] : ranks_) sum += peer.hello.value;
    std::string line = format_reply({Reply::Kind::Ok, sum, {}});
    std::string failed;
    for (auto& [r, peer] : ranks_) {
      if (auto sent = send_all(peer.fd.get(), line, deadline_); !sent) {
        failed += (failed.empty() ? "" : "; ") +
                  ("rank " + std::to_string(r) + " (from " + peer.from + "): ") + sent.error().message();
      }
    }
    if (!failed.empty()) {
      return make_error(ErrorCode::Internal, "could not release the barrier for every rank: " + failed);
    }
    return RendezvousResult{sum, refused_};
  }

  const RankEnv& env_;
  std::int64_t value_;
  const RendezvousOptions& options_;
  Deadline deadline_;
  Fd listener_;
  std::vector<Peer> pending_;
  std::map<int, Peer> ranks_;
  int refused_ = 0;
};

Result<RendezvousResult> run_peer(const RankEnv& env, std::int64_t value, const RendezvousOptions& options,
                                  Deadline deadline) {
  const std::string hello = format_hello(
      {env.rank, env.world_size, env.master_addr, env.master_port, env.job_id, env.attempt, value});
  const std::string master = master_text(env.master_addr, env.master_port);
  std::string last_error = "no connection yet";
  auto backoff = kFirstBackoff;
  auto timed_out = [&](const std::string& doing) {
    return make_error(ErrorCode::Timeout,
                      "timed out after " + format_duration(options.timeout) + " " + doing);
  };
  for (;;) {
    if (ms_left(deadline) == 0)
      return timed_out("reaching rank 0 at " + master + " (last error: " + last_error + ")");
    auto addresses = resolve(env.master_addr, env.master_port);
    if (!addresses) last_error = addresses.error().message();
    for (const Address& address : addresses ? *addresses : std::vector<Address>{}) {
      auto fd = connect_to(address, deadline);
      if (!fd) {
        last_error = "connect to " + describe(address.get(), address.length) + ": " + fd.error().message();
        continue;
      }
      if (auto sent = send_all(fd->get(), hello, deadline); !sent) {
        last_error = "send to " + master + ": " + sent.error().message();
        continue;
      }
      LineRead answer = read_line(fd->get(), deadline);
      switch (answer.kind) {
        case LineRead::Kind::TimedOut:
          return timed_out("waiting at " + master + " for rank 0 to release the barrier (WORLD_SIZE=" +
                           std::to_string(env.world_size) + ")");
        case LineRead::Kind::TooLong:
          return make_error(ErrorCode::Conflict, "something other than corral's rank 0 answers at " + master +
                                                     ": its answer is longer than a line");
        case LineRead::Kind::Closed:
          // Before rank 0 starts, the agent's port probe may hold the port and never
          // answer; when it lets go the connection is reset. Try again.
          last_error = "rank 0 at " + master + " " + answer.text + " without answering";
          continue;
        case LineRead::Kind::Line:
          break;
      }
      auto reply = parse_reply(answer.text);
      if (!reply) {
        return make_error(ErrorCode::Conflict, "something other than corral's rank 0 answers at " + master +
                                                   ": " + reply.error().message());
      }
      switch (reply->kind) {
        case Reply::Kind::Ok:
          return RendezvousResult{reply->sum, 0};
        case Reply::Kind::Refused:
          return make_error(ErrorCode::Conflict,
                            "rank 0 at " + master + " refused this rank: " + reply->message);
        case Reply::Kind::TimedOut:
          return make_error(ErrorCode::Timeout, "rank 0 at " + master + " gave up: " + reply->message);
      }
    }
    int wait = std::min(ms_left(deadline), static_cast<int>(backoff.count()));
    if (wait > 0) ::poll(nullptr, 0, wait);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace

Result<RendezvousResult> run_tcp_rendezvous(const RankEnv& env, std::int64_t value,
                                            const RendezvousOptions& options) {
  Deadline deadline = SteadyClock::now() + options.timeout;
  if (env.rank == 0) return Root(env, value, options, deadline).run();
  return run_peer(env, value, options, deadline);
}

}  // namespace corral::worker
