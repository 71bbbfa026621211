#pragma once
// Time as the core sees it: a value passed in, never read from a clock inside the core.

#include <algorithm>
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

// The timeline every timeout, grace, heartbeat deadline and time limit runs on: the
// host's monotonic clock, in milliseconds from an arbitrary origin. It never steps, so a
// wall-clock step (at boot, on VM resume, when NTP first syncs) moves no deadline. Not a
// date: never stored, never shown (it has no to_millis), and never mixed with a TimePoint.
struct MonotonicClock {
  using rep = Duration::rep;
  using period = Duration::period;
  using duration = Duration;
  using time_point = std::chrono::time_point<MonotonicClock, Duration>;
  static constexpr bool is_steady = true;
};
using Instant = MonotonicClock::time_point;

inline Instant instant_from_millis(std::int64_t ms) { return Instant(Duration(ms)); }

// One reading of both clocks: `wall` dates what happens, `mono` times it.
struct Now {
  TimePoint wall{};
  Instant mono{};

  // The instant of a past date (a job's start, read back after a restart): as long ago as
  // the wall clock says, and never later than now (a date ahead of the wall clock means
  // the clock stepped back since).
  Instant instant_of(TimePoint past) const { return mono - std::max(Duration::zero(), wall - past); }
  // The date of an instant, past or to come, as the wall clock reads now.
  TimePoint date_of(Instant at) const { return wall + (at - mono); }
  // Both clocks move on together (a test's time passing).
  Now& operator+=(Duration d) {
    wall += d;
    mono += d;
    return *this;
  }
  friend Now operator+(Now n, Duration d) { return n += d; }
  bool operator==(const Now&) const = default;
};

// The clocks the service layer reads; the core never does.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;  // the wall clock: dates
  virtual Instant mono() const = 0;   // the monotonic clock: deadlines
  Now read() const { return {now(), mono()}; }
};

class SystemClock final : public Clock {
 public:
  TimePoint now() const override {
    return std::chrono::time_point_cast<Duration>(std::chrono::system_clock::now());
  }
  Instant mono() const override {
    return Instant(std::chrono::duration_cast<Duration>(std::chrono::steady_clock::now().time_since_epoch()));
  }
};

}  // namespace corral
