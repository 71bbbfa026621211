#pragma once
// Serving a rank's log: a bounded slice of the file at an offset, with the file's size,
// so a client follows a log by asking again from where the last slice ended. A log whose
// middle was cut (log_cap) is served without its hole: a slice ends where the hole
// starts, and one asked for inside the hole starts after it (the answer says where).

#include <cstdint>
#include <string>

#include "common/core/error.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

// The most bytes one answer carries, whatever was asked.
inline constexpr std::uint64_t kMaxLogSlice = 1 << 20;

struct LogSlice {
  std::uint64_t offset = 0;  // where data starts: the offset asked for, or the end of a hole
  std::string data;          // bytes from there (empty at or past the end)
  std::uint64_t size = 0;    // the file's size now
  std::uint64_t cut = 0;     // bytes cut from the log's middle so far (rank_log_cap)
};

// NotFound when there is no such file.
Result<LogSlice> read_log_slice(const std::string& path, std::uint64_t offset, std::uint64_t max_bytes);

// The answer to `request` from the rank's log at `path`. `running`: the rank may still
// write to it (judged before the read, so a "finished" answer holds the whole log). A
// read of the disk: the agent calls it off its loop.
// `lost`: why part of the log may be missing (its spool could not take a write), or "".
protocol::LogData answer_log_request(const protocol::LogRequest& request, const std::string& path, bool running,
                                     const std::string& lost = "");

}  // namespace corral::agent
