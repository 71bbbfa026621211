#include "agent/log_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>

#include "agent/log_cap.hpp"

namespace corral::agent {

Result<LogSlice> read_log_slice(const std::string& path, std::uint64_t offset, std::uint64_t max_bytes) {
  std::lock_guard lock(log_cut_mutex());
  const std::optional<LogCut> cut = read_log_cut(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(errno == ENOENT ? ErrorCode::NotFound : ErrorCode::Internal,
                      "cannot open " + path + ": " + std::strerror(errno));
  }
  LogSlice slice;
  struct stat st{};
  if (::fstat(fd, &st) == 0) slice.size = static_cast<std::uint64_t>(st.st_size);
  std::uint64_t end = slice.size;
  if (cut) {
    slice.cut = cut->cut;
    if (offset >= cut->marker_end && offset < cut->tail_at) offset = cut->tail_at;
    // Where no hole could be made the log was truncated after the line: a follower that
    // was past the new end goes on from the line.
    if (offset > slice.size && cut->tail_at == cut->marker_end) offset = cut->marker_at;
    if (offset < cut->marker_end && cut->marker_end < cut->tail_at) end = std::min(end, cut->marker_end);
  }
  slice.offset = offset;
  if (offset < end) {
    auto want = static_cast<std::size_t>(std::min<std::uint64_t>({max_bytes, end - offset, kMaxLogSlice}));
    slice.data.resize(want);
    ssize_t n = ::pread(fd, slice.data.data(), want, static_cast<off_t>(offset));
    slice.data.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  }
  ::close(fd);
  return slice;
}

protocol::LogData answer_log_request(const protocol::LogRequest& request, const std::string& path, bool running,
                                     const std::string& lost) {
  protocol::LogData d;
  d.request = request.request;
  d.offset = request.offset;
  d.lost = lost;
  auto slice = read_log_slice(path, request.offset, request.max_bytes);
  if (!slice) {
    d.error = "no log for job " + std::to_string(request.job) + " rank " + std::to_string(request.rank) +
              " on this node" + (lost.empty() ? "" : ": " + lost);
    return d;
  }
  d.offset = slice->offset;
  d.cut = slice->cut;
  d.size = slice->size;
  d.data = std::move(slice->data);
  d.finished = !running;
  return d;
}

}  // namespace corral::agent
