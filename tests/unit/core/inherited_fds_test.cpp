// InheritedFds in a real forked child: what it leaves open, by close_range and by the
// fallback that kernels before 5.9 get.

#include "common/core/inherited_fds.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace corral {
namespace {

// Forks; the child opens descriptors without O_CLOEXEC at 40, 41 and 900, closes what
// InheritedFds closes (keeping 41), and exits with a bit per descriptor still open:
// 1 for 0-2 all open, 2 for 40, 4 for 41, 8 for 900.
int open_after_closing(bool try_close_range) {
  const InheritedFds inherited;
  pid_t pid = ::fork();
  if (pid == 0) {
    int fds[2];
    int sock = ::socket(AF_INET, SOCK_STREAM, 0);
    if (sock < 0 || ::pipe(fds) != 0) ::_exit(255);
    if (::dup2(sock, 40) != 40 || ::dup2(fds[0], 41) != 41 || ::dup2(fds[1], 900) != 900) ::_exit(255);
    inherited.close_all_but(41, try_close_range);
    auto open = [](int fd) { return ::fcntl(fd, F_GETFD) >= 0; };
    int bits = (open(0) && open(1) && open(2) ? 1 : 0) | (open(40) ? 2 : 0) | (open(41) ? 4 : 0) |
               (open(900) ? 8 : 0);
    // Nothing else above 2 either: the lowest free number is 3 (or 3 taken by nothing).
    int probe = ::open("/dev/null", O_RDONLY);
    if (probe != 3) bits |= 16;
    ::_exit(bits);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(InheritedFds, ClosesEveryDescriptorAboveTwoButTheOneKept) {
  EXPECT_EQ(open_after_closing(true), 1 | 4);
}

TEST(InheritedFds, TheFallbackWithoutCloseRangeClosesTheSame) {
  EXPECT_EQ(open_after_closing(false), 1 | 4);
}

}  // namespace
}  // namespace corral
