#pragma once
// Serving a rank's log: a bounded slice of the file at an offset, with the file's size,
// so a client follows a log by asking again from where the last slice ended.

#include <cstdint>
#include <string>

#include "common/core/error.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

// The most bytes one answer carries, whatever was asked.
inline constexpr std::uint64_t kMaxLogSlice = 1 << 20;

struct LogSlice {
  std::string data;       // bytes from the offset asked for (empty at or past the end)
  std::uint64_t size = 0;  // the file's size now
};

// NotFound when there is no such file.
Result<LogSlice> read_log_slice(const std::string& path, std::uint64_t offset, std::uint64_t max_bytes);

// The answer to `request` from the rank's log at `path`. `running`: the rank may still
// write to it (judged before the read, so a "finished" answer holds the whole log). A
// read of the disk: the agent calls it off its loop.
protocol::LogData answer_log_request(const protocol::LogRequest& request, const std::string& path, bool running);

}  // namespace corral::agent
