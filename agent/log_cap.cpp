#include "agent/log_cap.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/core/fd.hpp"
#include "common/core/files.hpp"

// How the middle is cut, and why so. A rank's stdout and stderr are its log opened with
// O_APPEND: whatever the agent does to the file, each of the rank's writes lands at its
// end at that moment. So the agent only ever touches bytes a quarter cap or more before
// the end, never racing a write, and:
// - punches a hole (FALLOC_FL_PUNCH_HOLE: ext4, XFS, btrfs, tmpfs) between the line that
//   says what was cut and the kept tail: the blocks go back to the file system while every
//   offset stays where it was, so a reader following the log from an offset finds its
//   place, and the file's size still counts all the rank wrote. FALLOC_FL_COLLAPSE_RANGE
//   would move the tail under a follower (and tmpfs refuses it); copying the tail down and
//   truncating would lose what the rank appends between the copy and the truncate.
// - where holes are refused, truncates the log just after that line instead: the tail
//   written so far is cut with the middle, but nothing the rank writes afterwards is lost,
//   since it is appended at the new end.

namespace corral::agent {

namespace {

std::string cut_path(const std::string& log_path) { return log_path + ".cut"; }

Error failed(const std::string& what, const std::string& path, int err) {
  return Error(ErrorCode::Unavailable, what + " " + path + ": " + std::strerror(err));
}

}  // namespace

std::string log_cut_marker(std::uint64_t cut) {
  return "\n[corral: " + std::to_string(cut) + " bytes cut from this log]\n";
}

std::optional<LogCut> read_log_cut(const std::string& log_path) {
  std::ifstream in(cut_path(log_path));
  LogCut c;
  if (!(in >> c.marker_at >> c.marker_end >> c.tail_at >> c.cut)) return std::nullopt;
  if (c.marker_end < c.marker_at || c.tail_at < c.marker_end) return std::nullopt;
  return c;
}

std::mutex& log_cut_mutex() {
  static std::mutex mutex;
  return mutex;
}

Result<std::uint64_t> cap_log(const std::string& log_path, std::uint64_t cap) {
  std::lock_guard lock(log_cut_mutex());
  UniqueFd fd(::open(log_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd && errno == ENOENT) return make_error(ErrorCode::NotFound, "no log " + log_path);
  if (!fd) return std::unexpected(failed("cannot open", log_path, errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return std::unexpected(failed("cannot stat", log_path, errno));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::optional<LogCut> before = read_log_cut(log_path);
  const std::uint64_t skipped = before ? before->tail_at - before->marker_end : 0;
  if (size < skipped || size - skipped <= cap) return std::uint64_t{0};

  const std::uint64_t block = st.st_blksize > 0 ? static_cast<std::uint64_t>(st.st_blksize) : 4096;
  LogCut cut;
  cut.marker_at = before ? before->marker_at : cap / 2 / block * block;
  const std::uint64_t cut_from = before ? before->tail_at : cut.marker_at;
  // The latest quarter cap stays, from a block boundary, so that the next cut comes only
  // after the rank wrote another quarter.
  cut.tail_at = (size - cap / 4) / block * block;
  if (cut.tail_at <= cut_from) return std::uint64_t{0};
  cut.cut = (before ? before->cut : 0) + (cut.tail_at - cut_from);
  std::string marker = log_cut_marker(cut.cut);
  cut.marker_end = cut.marker_at + marker.size();
  if (cut.marker_end > cut.tail_at) return std::uint64_t{0};  // a cap too small for the line

  // The line first, over bytes being cut; then the hole, which gives room back to a full
  // spool before the record is written. Readers wait for all three (log_cut_mutex).
  if (::pwrite(fd.get(), marker.data(), marker.size(), static_cast<off_t>(cut.marker_at)) !=
      static_cast<ssize_t>(marker.size())) {
    return std::unexpected(failed("cannot write to", log_path, errno == 0 ? ENOSPC : errno));
  }
  const bool punch = ::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                 static_cast<off_t>(cut.marker_end),
                                 static_cast<off_t>(cut.tail_at - cut.marker_end)) == 0;
  if (!punch) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) return std::unexpected(failed("cannot cut", log_path, err));
    // No holes here: everything after the line goes (see above). The size is looked at
    // again just before, so what the rank wrote meanwhile is counted, nearly all of it.
    if (::fstat(fd.get(), &st) != 0) return std::unexpected(failed("cannot stat", log_path, errno));
    cut.cut = (before ? before->cut : 0) + (static_cast<std::uint64_t>(st.st_size) - cut_from);
    marker = log_cut_marker(cut.cut);
    cut.marker_end = cut.marker_at + marker.size();
    cut.tail_at = cut.marker_end;
    if (::pwrite(fd.get(), marker.data(), marker.size(), static_cast<off_t>(cut.marker_at)) !=
            static_cast<ssize_t>(marker.size()) ||
        ::ftruncate(fd.get(), static_cast<off_t>(cut.marker_end)) != 0) {
      return std::unexpected(failed("cannot cut", log_path, errno));
    }
  }
  char record[128];
  std::snprintf(record, sizeof(record), "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", cut.marker_at,
                cut.marker_end, cut.tail_at, cut.cut);
  if (auto w = write_file_atomically(cut_path(log_path), record, 0644, Survives::kill); !w) {
    return std::unexpected(w.error());
  }
  return cut.cut - (before ? before->cut : 0);
}

std::string cap_logs(const std::vector<std::string>& logs, std::uint64_t cap) {
  std::string problem;
  for (const auto& log : logs) {
    auto cut = cap_log(log, cap);
    if (!cut && cut.error().code() != ErrorCode::NotFound && problem.empty()) problem = cut.error().message();
  }
  return problem;
}

}  // namespace corral::agent
