#pragma once
// Serving a rank's log: a bounded slice of the file at an offset, with the file's size,
// so a client follows a log by asking again from where the last slice ended.

#include <cstdint>
#include <string>

#include "common/core/error.hpp"

namespace corral::agent {

// The most bytes one answer carries, whatever was asked.
inline constexpr std::uint64_t kMaxLogSlice = 1 << 20;

struct LogSlice {
  std::string data;       // bytes from the offset asked for (empty at or past the end)
  std::uint64_t size = 0;  // the file's size now
};

// NotFound when there is no such file.
Result<LogSlice> read_log_slice(const std::string& path, std::uint64_t offset, std::uint64_t max_bytes);

}  // namespace corral::agent
