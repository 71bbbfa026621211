#include "agent/inventory/run_command.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <set>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/core/fd.hpp"

namespace corral::agent {

namespace {

using SteadyClock = std::chrono::steady_clock;

// The children run_command calls have started and not reaped yet (run_command_owns).
std::mutex owned_mutex;
std::set<pid_t> owned_pids;

void disown(pid_t pid) {
  std::lock_guard lock(owned_mutex);
  owned_pids.erase(pid);
}

// How long to wait for a process group that was sent SIGKILL. A process stuck in the
// kernel (a wedged GPU driver does that to nvidia-smi) may never die; the caller must
// not hang with it.
constexpr Duration kKillGrace{2000};

// Owns one file descriptor.
using Fd = UniqueFd;

std::string system_message(int err) {
  return std::system_category().message(err);
}

// "nvidia-smi topo -m", cut short: messages name the command, they do not log argv.
std::string describe_command(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& arg : argv) {
    if (!text.empty()) text += ' ';
    text += arg;
    if (text.size() > 120) {
      text.resize(120);
      text += "...";
      break;
    }
  }
  return "`" + text + "`";
}

struct Pipe {
  Fd read_end;
  Fd write_end;
};

Result<Pipe> make_pipe() {
  std::array<int, 2> fds{-1, -1};
  // Close-on-exec so that a program started concurrently elsewhere in the agent cannot
  // inherit our write end and keep the pipe open.
  if (::pipe2(fds.data(), O_CLOEXEC) != 0) {
    return make_error(ErrorCode::Internal, "pipe2: " + system_message(errno));
  }
  Pipe p{Fd(fds[0]), Fd(fds[1])};
  const int flags = ::fcntl(p.read_end.get(), F_GETFL);
  if (flags < 0 || ::fcntl(p.read_end.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return make_error(ErrorCode::Internal, "fcntl: " + system_message(errno));
  }
  return p;
}

// posix_spawn's attribute objects need destroying on every path.
class SpawnSetup {
 public:
  SpawnSetup() {
    actions_ok_ = ::posix_spawn_file_actions_init(&actions_) == 0;
    attr_ok_ = ::posix_spawnattr_init(&attr_) == 0;
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
  ~SpawnSetup() {
    if (actions_ok_) ::posix_spawn_file_actions_destroy(&actions_);
    if (attr_ok_) ::posix_spawnattr_destroy(&attr_);
  }

  // Returns 0 or an errno value.
  int prepare(int out_fd, int err_fd) {
    if (!actions_ok_ || !attr_ok_) return ENOMEM;
    if (int rc = ::posix_spawn_file_actions_addopen(&actions_, 0, "/dev/null", O_RDONLY, 0); rc != 0)
      return rc;
    if (int rc = ::posix_spawn_file_actions_adddup2(&actions_, out_fd, 1); rc != 0) return rc;
    if (int rc = ::posix_spawn_file_actions_adddup2(&actions_, err_fd, 2); rc != 0) return rc;
    // Descriptors the agent opened without O_CLOEXEC (sockets, logs) must not leak into
    // the child, or the child could hold a connection open after the agent drops it.
    if (int rc = ::posix_spawn_file_actions_addclosefrom_np(&actions_, 3); rc != 0) return rc;

    // Its own process group, so that a timeout kills whatever it started too; a clean
    // signal mask and default dispositions, whatever the agent blocks or ignores.
    short flags = POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (int rc = ::posix_spawnattr_setflags(&attr_, flags); rc != 0) return rc;
    if (int rc = ::posix_spawnattr_setpgroup(&attr_, 0); rc != 0) return rc;
    sigset_t none;
    sigset_t all;
    sigemptyset(&none);
    sigfillset(&all);
    if (int rc = ::posix_spawnattr_setsigmask(&attr_, &none); rc != 0) return rc;
    if (int rc = ::posix_spawnattr_setsigdefault(&attr_, &all); rc != 0) return rc;
    return 0;
  }

  const posix_spawn_file_actions_t* actions() const { return &actions_; }
  const posix_spawnattr_t* attr() const { return &attr_; }

 private:
  posix_spawn_file_actions_t actions_{};
  posix_spawnattr_t attr_{};
  bool actions_ok_ = false;
  bool attr_ok_ = false;
};

// A started child: reaps it, and kills its group if it is abandoned on an error path.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {
    // A pidfd turns "the child exited" into something poll() can wait for; without one
    // (kernels before 5.3) the loop below falls back to short polls.
    const long fd = ::syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) pidfd_ = Fd(static_cast<int>(fd));
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (!reaped_) kill_group_and_reap();
    // Reaped, or stuck in the kernel: whoever reaps the process's other children may
    // reap this one when it finally goes.
    disown(pid_);
  }

  int pidfd() const { return pidfd_.get(); }
  bool reaped() const { return reaped_; }
  int status() const { return status_; }

  // True once the child has exited and been reaped.
  bool try_reap() {
    if (reaped_) return true;
    int status = 0;
    pid_t r = 0;
    do {
      r = ::waitpid(pid_, &status, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) {
      reaped_ = true;
      status_ = status;
    } else if (r < 0) {
      // ECHILD: someone else (a SIGCHLD handler set to SIG_IGN) reaped it; it is gone.
      reaped_ = true;
      status_ = 0;
      lost_status_ = true;
    }
    return reaped_;
  }

  bool lost_status() const { return lost_status_; }

  // SIGKILL to the whole group, then wait a bounded time for the child itself. Returns
  // false when it is still not gone (stuck in the kernel).
  bool kill_group_and_reap() {
    ::kill(-pid_, SIGKILL);
    if (try_reap()) return true;
    if (pidfd_.valid()) {
      pollfd p{pidfd_.get(), POLLIN, 0};
      const auto deadline = SteadyClock::now() + kKillGrace;
      while (!try_reap()) {
        const auto left = std::chrono::duration_cast<Duration>(deadline - SteadyClock::now());
        if (left.count() <= 0) return false;
        ::poll(&p, 1, static_cast<int>(left.count()));
      }
      return true;
    }
    // No pidfd: SIGKILL cannot be caught, so a blocking wait ends unless the kernel
    // itself is stuck, which this old-kernel path accepts.
    int status = 0;
    pid_t r = 0;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    reaped_ = true;
    status_ = status;
    return true;
  }

 private:
  pid_t pid_;
  Fd pidfd_;
  bool reaped_ = false;
  bool lost_status_ = false;
  int status_ = 0;
};

struct Stream {
  Fd fd;
  std::string* sink = nullptr;
  const char* name = "";
};

enum class Drain { Open, Closed, TooLarge, Failed };

// Reads whatever is available now.
Drain drain(Stream& s, std::size_t max_bytes) {
  std::array<char, 65536> buffer{};
  while (true) {
    const ssize_t n = ::read(s.fd.get(), buffer.data(), buffer.size());
    if (n > 0) {
      if (s.sink->size() + static_cast<std::size_t>(n) > max_bytes) return Drain::TooLarge;
      s.sink->append(buffer.data(), static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) {
      s.fd.reset();
      return Drain::Closed;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Drain::Open;
    return Drain::Failed;
  }
}

std::string stuck_note(bool gone) {
  return gone ? "" : "; it did not exit after SIGKILL (stuck in the kernel?)";
}

}  // namespace

Result<CommandOutput> run_command(const std::vector<std::string>& argv, Duration timeout,
                                  std::size_t max_output_bytes) {
  if (argv.empty() || argv.front().empty()) {
    return make_error(ErrorCode::InvalidArgument, "run_command: no program given");
  }
  if (timeout.count() <= 0) {
    return make_error(ErrorCode::InvalidArgument, "run_command: the timeout must be positive");
  }
  const std::string what = describe_command(argv);
  const auto deadline = SteadyClock::now() + timeout;

  auto out_pipe = make_pipe();
  if (!out_pipe) return std::unexpected(out_pipe.error());
  auto err_pipe = make_pipe();
  if (!err_pipe) return std::unexpected(err_pipe.error());

  SpawnSetup setup;
  if (int rc = setup.prepare(out_pipe->write_end.get(), err_pipe->write_end.get()); rc != 0) {
    return make_error(ErrorCode::Internal, what + ": preparing to start: " + system_message(rc));
  }

  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  pid_t pid = -1;
  int rc = 0;
  {
    // Started and registered under one lock: run_command_owns waits for both.
    std::lock_guard lock(owned_mutex);
    // glibc's posix_spawnp reports a failed exec as its return value (it waits for the
    // exec in a vfork-style child), so a missing program is an error here, not exit 127.
    rc = ::posix_spawnp(&pid, args[0], setup.actions(), setup.attr(), args.data(), environ);
    if (rc == 0) owned_pids.insert(pid);
  }
  if (rc != 0) {
    if (rc == ENOENT || rc == ENOTDIR) {
      return make_error(ErrorCode::NotFound, what + ": program not found: " + argv.front());
    }
    if (rc == EACCES || rc == EPERM) {
      return make_error(ErrorCode::PermissionDenied, what + ": may not be run: " + system_message(rc));
    }
    return make_error(ErrorCode::Unavailable, what + ": could not be started: " + system_message(rc));
  }
  Child child(pid);
  out_pipe->write_end.reset();
  err_pipe->write_end.reset();

  CommandOutput result;
  std::array<Stream, 2> streams{Stream{std::move(out_pipe->read_end), &result.out, "stdout"},
                                Stream{std::move(err_pipe->read_end), &result.err, "stderr"}};

  while (true) {
    const bool streams_open = streams[0].fd.valid() || streams[1].fd.valid();
    if (child.pidfd() < 0) child.try_reap();
    if (!streams_open && child.reaped()) break;

    const auto left = std::chrono::ceil<Duration>(deadline - SteadyClock::now());
    if (left.count() <= 0) {
      const bool gone = child.kill_group_and_reap();
      return make_error(ErrorCode::Timeout, what + " did not finish within " +
                                                std::to_string(timeout.count()) +
                                                "ms; its process group was killed" + stuck_note(gone));
    }

    std::array<pollfd, 3> fds{};
    nfds_t count = 0;
    std::array<Stream*, 2> polled{};
    for (auto& s : streams) {
      if (!s.fd.valid()) continue;
      polled[count] = &s;
      fds[count++] = pollfd{s.fd.get(), POLLIN, 0};
    }
    const nfds_t streams_polled = count;
    if (!child.reaped() && child.pidfd() >= 0) fds[count++] = pollfd{child.pidfd(), POLLIN, 0};

    int wait_ms = static_cast<int>(std::min<Duration::rep>(left.count(), 60'000));
    // Without a pidfd nothing wakes us when the child exits after closing its output:
    // check again soon (only on kernels older than 5.3).
    if (child.pidfd() < 0 && !child.reaped()) wait_ms = std::min(wait_ms, 10);
    const int ready = ::poll(fds.data(), count, wait_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::Internal, what + ": poll: " + system_message(errno));
    }

    for (nfds_t i = 0; i < streams_polled; ++i) {
      if (fds[i].revents == 0) continue;
      Stream& s = *polled[i];
      switch (drain(s, max_output_bytes)) {
        case Drain::Open:
        case Drain::Closed:
          break;
        case Drain::TooLarge: {
          const bool gone = child.kill_group_and_reap();
          return make_error(ErrorCode::ResourceExhausted,
                            what + " wrote more than " + std::to_string(max_output_bytes) + " bytes to " +
                                s.name + "; its process group was killed" + stuck_note(gone));
        }
        case Drain::Failed:
          return make_error(ErrorCode::Internal, what + ": reading " + s.name + ": " + system_message(errno));
      }
    }
    if (count > streams_polled && fds[streams_polled].revents != 0) child.try_reap();
  }

  if (child.lost_status()) {
    return make_error(ErrorCode::Internal,
                      what + ": its exit status was lost (is SIGCHLD ignored in this process?)");
  }
  const int status = child.status();
  if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
    result.exit_code = 128 + result.signal;
  } else {
    result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

bool run_command_owns(pid_t pid) {
  std::lock_guard lock(owned_mutex);
  return owned_pids.contains(pid);
}

}  // namespace corral::agent
