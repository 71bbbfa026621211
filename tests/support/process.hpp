#pragma once
// A child process for tests: started with its own environment, its stderr (and
// optionally stdout) read line by line so a test can wait for an event it prints
// ("listening on") instead of sleeping.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace corral::testing {

class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { kill_and_wait(SIGKILL); }

  // Starts argv with `env` added to (or replacing in) the current environment.
  bool start(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    int err[2];
    int out[2];
    if (::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(err[1]);
    ::close(out[1]);
    {
      std::lock_guard lock(mu_);
      eof_ = false;
    }
    err_ = err[0];
    out_ = out[0];
    // Drain stderr all the time: a daemon that fills the pipe would block on its logs.
    reader_ = std::thread([this, fd = err_] {
      std::string buf;
      char chunk[4096];
      for (;;) {
        ssize_t n = ::read(fd, chunk, sizeof(chunk));
        if (n <= 0) break;
        buf.append(chunk, static_cast<std::size_t>(n));
        std::size_t nl;
        std::lock_guard lock(mu_);
        while ((nl = buf.find('\n')) != std::string::npos) {
          lines_.push_back(buf.substr(0, nl));
          buf.erase(0, nl + 1);
        }
        cv_.notify_all();
      }
      std::lock_guard lock(mu_);
      eof_ = true;
      cv_.notify_all();
    });
    return true;
  }

  pid_t pid() const { return pid_; }

  // Waits until a stderr line (new since the last match) contains `needle`.
  bool wait_for_line(const std::string& needle, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock lock(mu_);
    bool matched = false;
    cv_.wait_for(lock, timeout, [&] {
      for (; scanned_ < lines_.size(); ++scanned_) {
        if (lines_[scanned_].find(needle) != std::string::npos) {
          ++scanned_;
          matched = true;
          return true;
        }
      }
      return eof_;
    });
    return matched;
  }

  // Everything left on stdout until the child closes it.
  std::string read_stdout() {
    std::string all;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(out_, buf, sizeof(buf));
      if (n <= 0) break;
      all.append(buf, static_cast<std::size_t>(n));
    }
    return all;
  }

  // Waits, until `deadline` at most, for the child to exit and close its stdout, which is
  // appended to `out`. Its exit status, or nothing when the deadline came first: the child
  // is then still running, for the caller to kill. Waits on a pidfd, never by polling.
  std::optional<int> wait_until(std::chrono::steady_clock::time_point deadline, std::string& out) {
    if (pid_ <= 0) return status_;
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd < 0) return std::nullopt;
    bool exited = false;
    bool eof = false;
    char buf[4096];
    while (!(exited && eof)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd fds[2] = {{eof ? -1 : out_, POLLIN, 0}, {exited ? -1 : pidfd, POLLIN, 0}};
      if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
      if (fds[0].revents != 0) {
        ssize_t n = ::read(out_, buf, sizeof(buf));
        if (n > 0) out.append(buf, static_cast<std::size_t>(n));
        else eof = true;
      }
      if (fds[1].revents != 0) exited = true;
    }
    ::close(pidfd);
    if (!(exited && eof)) return std::nullopt;
    return wait();
  }

  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

  // Exit status, once it exits.
  int wait() {
    if (pid_ <= 0) return status_;
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    close_pipes();
    return status_;
  }

  void kill_and_wait(int sig) {
    if (pid_ <= 0) return;
    ::kill(-pid_, sig);
    ::kill(pid_, sig);
    wait();
  }

 private:
  void close_pipes() {
    if (reader_.joinable()) reader_.join();
    if (err_ >= 0) ::close(err_);
    if (out_ >= 0) ::close(out_);
    err_ = out_ = -1;
  }


  pid_t pid_ = -1;
  int status_ = 0;
  int err_ = -1;
  int out_ = -1;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  std::size_t scanned_ = 0;
  bool eof_ = false;
};

// A command run to its end: its exit status (128 + signal when killed), stdout, stderr.
struct Outcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline Outcome run_to_end(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  Child child;
  Outcome o;
  if (!child.start(argv, env)) return o;
  o.out = child.read_stdout();
  int status = child.wait();
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  for (const auto& line : child.lines()) o.err += line + "\n";
  return o;
}

// Runs a command to completion; returns (exit status, stdout).
inline std::pair<int, std::string> run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  Child c;
  if (!c.start(argv, env)) return {-1, ""};
  std::string out = c.read_stdout();
  int status = c.wait();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

}  // namespace corral::testing
