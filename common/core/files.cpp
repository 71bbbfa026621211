#include "common/core/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace corral {

Result<void> write_file_atomically(const std::string& path, std::string_view content, mode_t mode,
                                   Survives survives) {
  auto failed = [&](const std::string& tmp, int err) -> Result<void> {
    if (!tmp.empty()) ::unlink(tmp.c_str());
    return make_error(ErrorCode::Unavailable, "cannot write " + path + ": " + std::strerror(err));
  };
  // Unique per thread (its kernel id, which is the pid in a process's first thread): two
  // writers of the same path, in two processes or two threads of one, never share a
  // temporary file. Made anew, never through a link: whatever is in the way (a file a
  // killed writer of the same id left, a link someone planted) is removed first, the link
  // and not its target.
  std::string tmp = path + ".tmp." + std::to_string(::gettid());
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), kFlags, mode);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0) fd = ::open(tmp.c_str(), kFlags, mode);
  if (fd < 0) return failed("", errno);
  ::fchmod(fd, mode);  // whatever the umask
  std::size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return failed(tmp, err);
    }
    done += static_cast<std::size_t>(n);
  }
  if (survives == Survives::crash && ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return failed(tmp, err);
  }
  if (::close(fd) != 0) return failed(tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return failed(tmp, errno);
  return {};
}

}  // namespace corral
