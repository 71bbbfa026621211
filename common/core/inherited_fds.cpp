#include "common/core/inherited_fds.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace corral {

namespace {

// The record getdents64 fills in; glibc declares it only for its own readdir.
struct LinuxDirent64 {
  std::uint64_t d_ino;
  std::int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];  // NUL-terminated, as long as d_reclen allows
};

// close_range(first, last, 0); false when the kernel or libc lacks it.
bool close_range_of(unsigned first, unsigned last) {
  if (first > last) return true;
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, first, last, 0) == 0) return true;
  // ENOSYS: a kernel before 5.9; EINVAL: one that knows the call but not its use here.
  return false;
#else
  return false;
#endif
}

// A pass over /proc/self/fd that closes what it lists; false when /proc cannot be read.
// Closing while listing can make the kernel skip entries, so it lists again until a
// pass finds nothing left to close.
bool close_listed(int keep) {
  int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(LinuxDirent64) char buffer[4096];
  for (bool closed = true; closed;) {
    closed = false;
    if (::lseek(dir, 0, SEEK_SET) != 0) break;
    for (;;) {
      long n = ::syscall(SYS_getdents64, dir, buffer, sizeof(buffer));
      if (n <= 0) break;
      for (long at = 0; at < n;) {
        const auto* entry = reinterpret_cast<const LinuxDirent64*>(buffer + at);
        at += entry->d_reclen;
        int fd = 0;
        bool number = entry->d_name[0] != '\0';
        for (const char* c = entry->d_name; *c != '\0' && number; ++c) {
          if (*c < '0' || *c > '9' || fd > INT_MAX / 10 - 1) number = false;
          else fd = fd * 10 + (*c - '0');
        }
        if (!number || fd <= 2 || fd == keep || fd == dir) continue;
        ::close(fd);
        closed = true;
      }
    }
  }
  ::close(dir);
  return true;
}

}  // namespace

InheritedFds::InheritedFds() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    // A limit in the millions would make the last resort slow, but it is only reached
    // without close_range and without /proc.
    limit_ = limit.rlim_cur > static_cast<rlim_t>(INT_MAX) ? INT_MAX : static_cast<int>(limit.rlim_cur);
  }
}

void InheritedFds::close_all_but(int keep, bool try_close_range) const noexcept {
  const int saved = errno;
  bool done = false;
  if (!try_close_range) {
  } else if (keep < 3) {
    done = close_range_of(3, ~0U);
  } else {
    done = close_range_of(3, static_cast<unsigned>(keep) - 1) && close_range_of(static_cast<unsigned>(keep) + 1, ~0U);
  }
  if (!done && !close_listed(keep)) {
    for (int fd = 3; fd < limit_; ++fd) {
      if (fd != keep) ::close(fd);
    }
  }
  errno = saved;
}

}  // namespace corral
