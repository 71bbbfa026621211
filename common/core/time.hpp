#pragma once
// Time as the core sees it: a value passed in, never read from a clock inside the core.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace corral {

using Duration = std::chrono::milliseconds;
// Milliseconds since the Unix epoch (UTC). Stored as an integer in SQLite.
using TimePoint = std::chrono::sys_time<std::chrono::milliseconds>;

inline std::int64_t to_millis(TimePoint t) { return t.time_since_epoch().count(); }
inline TimePoint from_millis(std::int64_t ms) { return TimePoint(Duration(ms)); }

// RFC 3339 in UTC with milliseconds, as the API writes times: 2026-12-02T10:00:00.123Z.
std::string format_time(TimePoint t);
// RFC 3339 with any number of fraction digits (milliseconds kept) and Z or an offset.
std::optional<TimePoint> parse_rfc3339(std::string_view text);

// The clock the service layer reads; the core never does.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint now() const override {
    return std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
  }
};

}  // namespace corral
