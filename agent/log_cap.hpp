#pragma once
// Keeping a rank's log under the agent's rank_log_cap while the rank writes to it. Ranks
// write straight into their log file (no copy by the agent), so the agent cuts the log's
// middle from outside: it keeps the head, writes a line saying how much was cut, and gives
// back the disk blocks between that line and the latest tail. What was cut is recorded
// beside the log (`rank-R.log.cut`) so that the log's readers skip the hole and say that
// the log was cut. Plain file operations: the agent calls them on a pool thread.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/core/error.hpp"

namespace corral::agent {

struct LogCut {
  std::uint64_t marker_at = 0;   // the head ends here, and the line saying what was cut starts
  std::uint64_t marker_end = 0;  // that line ends here
  std::uint64_t tail_at = 0;     // the kept tail starts here; [marker_end, tail_at) is a hole
  std::uint64_t cut = 0;         // bytes of the rank's output cut so far
  bool operator==(const LogCut&) const = default;
};

// Held while a log is cut, and by a reader while it reads a log and its record, so that
// a reader never meets a hole its record does not name yet.
std::mutex& log_cut_mutex();

// "\n[corral: N bytes cut from this log]\n"
std::string log_cut_marker(std::uint64_t cut);

// What cap_log has cut from the log at `log_path`; nullopt when nothing.
std::optional<LogCut> read_log_cut(const std::string& log_path);

// When the log at `log_path` keeps more than `cap` bytes: cuts its middle so that it keeps
// its head (half the cap), the line saying what was cut, and its latest quarter cap, and
// returns the bytes cut now (0 when it was under the cap). Unavailable with the reason
// when the log cannot be read or written (a full spool says ENOSPC here).
Result<std::uint64_t> cap_log(const std::string& log_path, std::uint64_t cap);

// cap_log on each of `logs`: why the spool could not take what was asked of it (the
// first such failure), or "". A log that is gone is no failure.
std::string cap_logs(const std::vector<std::string>& logs, std::uint64_t cap);

}  // namespace corral::agent
