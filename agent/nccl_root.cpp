#include "agent/nccl_root.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "agent/launcher.hpp"
#include "common/core/hex.hpp"

namespace corral::agent {

Result<NcclRootChild> start_nccl_root(const std::string& worker, const std::string& interface,
                                      const std::string& log_path) {
  int out[2];
  int in[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return make_error(ErrorCode::Internal, std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(in, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(out[0]);
    ::close(out[1]);
    return make_error(ErrorCode::Internal, std::string("pipe: ") + std::strerror(err));
  }
  ProcessSpec spec;
  spec.argv = {worker, "nccl-root"};
  const char* path = std::getenv("PATH");
  spec.envp = {"PATH=" + std::string(path != nullptr ? path : "/usr/bin:/bin")};
  if (!interface.empty()) spec.envp.push_back("NCCL_SOCKET_IFNAME=" + interface);
  spec.log_path = log_path;
  spec.stdout_fd = out[1];
  spec.stdin_fd = in[0];
  auto pid = spawn(spec);
  ::close(out[1]);
  ::close(in[0]);
  if (!pid) {
    ::close(out[0]);
    ::close(in[1]);
    return make_error(ErrorCode::Internal, "cannot start nccl-root: " + pid.error().message());
  }
  return NcclRootChild{*pid, in[1], out[0], log_path};
}

namespace {

std::string read_first_line(int fd, Duration timeout) {
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[512];
  while (line.find('\n') == std::string::npos) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buf, static_cast<std::size_t>(n));
  }
  auto nl = line.find('\n');
  return nl == std::string::npos ? "" : line.substr(0, nl);
}

}  // namespace

Result<std::string> read_nccl_root_id(int fd, const std::string& log_path, Duration timeout) {
  std::string id = read_first_line(fd, timeout);
  ::close(fd);
  if (check_nccl_unique_id(id)) return id;
  std::ifstream log(log_path);
  std::string why;
  std::getline(log, why);
  return make_error(ErrorCode::Unavailable, "nccl-root gave no unique ID" + (why.empty() ? std::string() : ": " + why));
}

void NcclRootHold::hold(const NcclRootChild& child) {
  release();
  pid_ = child.pid;
  group_ = child.pid;
  stdin_fd_ = child.stdin_fd;
}

bool NcclRootHold::reaped(pid_t pid) {
  if (pid_ == 0 || pid != pid_) return false;
  pid_ = 0;
  let_go_if_empty();
  return true;
}

void NcclRootHold::let_go_if_empty() {
  // A leader killed by release() but not reaped yet keeps the group alive (a zombie).
  if (pid_ == 0 && group_ != 0 && !group_alive(group_)) group_ = 0;
}

void NcclRootHold::release() {
  if (stdin_fd_ >= 0) {
    ::close(stdin_fd_);
    stdin_fd_ = -1;
  }
  // Only while its leader is not reaped: until then no other group can take its id.
  // What outlives a reaped leader is the sweep's to find.
  if (pid_ != 0) signal_group(pid_, SIGKILL);
  pid_ = 0;
}

}  // namespace corral::agent
