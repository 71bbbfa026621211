#pragma once
// Time as the core sees it: a value passed in, never read from a clock inside the core.

#include <chrono>
#include <cstdint>

namespace corral {

using Duration = std::chrono::milliseconds;
// Milliseconds since the Unix epoch (UTC). Stored as an integer in SQLite.
using TimePoint = std::chrono::sys_time<std::chrono::milliseconds>;

inline std::int64_t to_millis(TimePoint t) { return t.time_since_epoch().count(); }
inline TimePoint from_millis(std::int64_t ms) { return TimePoint(Duration(ms)); }

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
