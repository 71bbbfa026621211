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
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/core/fd.hpp"
#include "common/core/inherited_fds.hpp"

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

// What start_child gives back: the child's pid, or the errno of what failed (the exec's
// own, through a close-on-exec pipe, so that a missing program is an error here and not
// exit status 127).
struct Started {
  pid_t pid = -1;
  int error = 0;
};

// Starts args[0] (looked up on PATH) with stdout and stderr on the given descriptors and
// stdin from /dev/null, in its own process group (so that a timeout kills whatever it
// started too), with a clean signal mask and default dispositions whatever the agent
// blocks or ignores, and none of the agent's descriptors but 0-2: a child must not hold
// a connection or a pipe open after the agent drops it. The child calls only
// async-signal-safe functions (execvp searches PATH with buffers on the stack).
Started start_child(char* const* args, int out_fd, int err_fd) {
  const InheritedFds inherited;
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return {-1, errno};
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return {-1, err};
  }
  if (pid == 0) {
    ::close(report[0]);
    ::setpgid(0, 0);
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &default_action, nullptr);  // some refuse: fine
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0 && ::dup2(null, 0) == 0 && ::dup2(out_fd, 1) == 1 && ::dup2(err_fd, 2) == 2) {
      inherited.close_all_but(report[1]);
      ::execvp(args[0], args);
    }
    const int err = errno;
    (void)!::write(report[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::close(report[1]);
  // Also from the parent: whichever runs first, the group exists before a timeout
  // might signal it.
  ::setpgid(pid, pid);
  int err = 0;
  ssize_t n = 0;
  do {
    n = ::read(report[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n != static_cast<ssize_t>(sizeof(err))) return {pid, 0};  // closed by the exec
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {-1, err};
}

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

  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  pid_t pid = -1;
  int rc = 0;
  {
    // Started and registered under one lock: run_command_owns waits for both.
    std::lock_guard lock(owned_mutex);
    const Started started = start_child(args.data(), out_pipe->write_end.get(), err_pipe->write_end.get());
    pid = started.pid;
    rc = started.error;
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
