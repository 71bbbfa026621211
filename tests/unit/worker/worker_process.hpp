#pragma once
// A corral-worker child for tests: started with exactly the environment given (nothing
// inherited, so the test's own environment cannot leak a RANK in), stdout and stderr
// captured. Tests wait for what it prints or for its exit, never for time to pass.

#include <cerrno>
#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corral::worker::testing {

struct Finished {
  int exit_code = -1;  // 128 + signal when killed
  std::string out;
  std::string err;
};

class WorkerProcess {
 public:
  WorkerProcess(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
    int out[2];
    int err[2];
    int in[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(in, O_CLOEXEC) != 0) return;
    std::vector<std::string> argv_text = {CORRAL_WORKER_BIN};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<std::string> env_text;
    for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
    std::vector<char*> argv;
    for (auto& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    stdin_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  ~WorkerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    for (int fd : {stdin_, out_, err_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  bool started() const { return pid_ > 0; }
  // What wait_for and finish have read so far.
  const std::string& stdout_text() const { return out_text_; }
  pid_t pid() const { return pid_; }

  void close_stdin() {
    if (stdin_ >= 0) ::close(stdin_);
    stdin_ = -1;
  }

  // Reads until a line of stdout (or of stderr, with `from_stderr`) contains `needle`.
  bool wait_for(std::string_view needle, bool from_stderr,
                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string& text = from_stderr ? err_text_ : out_text_;
    while (text.find(needle) == std::string::npos) {
      if (!read_some(deadline)) return false;
    }
    return true;
  }

  // Reads both pipes to their end, then reaps the child. A child that outlives
  // `timeout` is killed, which the exit code (128 + 9) shows.
  Finished finish(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while ((out_ >= 0 || err_ >= 0) && read_some(deadline)) {
    }
    if (out_ >= 0 || err_ >= 0) ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out_text_, err_text_};
  }

 private:
  // One poll over whichever pipes are open; false at the deadline or when both closed.
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    std::vector<pollfd> fds;
    if (out_ >= 0) fds.push_back({out_, POLLIN, 0});
    if (err_ >= 0) fds.push_back({err_, POLLIN, 0});
    if (fds.empty()) return false;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) return true;
    if (rc <= 0) return false;
    for (const pollfd& p : fds) {
      if (p.revents == 0) continue;
      char buf[4096];
      ssize_t n = ::read(p.fd, buf, sizeof(buf));
      std::string& text = p.fd == out_ ? out_text_ : err_text_;
      if (n > 0) {
        text.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(p.fd);
        (p.fd == out_ ? out_ : err_) = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int stdin_ = -1;
  int out_ = -1;
  int err_ = -1;
  std::string out_text_;
  std::string err_text_;
};

// A port that nothing listened on a moment ago: the kernel's choice for port 0.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace corral::worker::testing
