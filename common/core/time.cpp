#include "common/core/time.hpp"

#include <charconv>
#include <cstdio>
#include <ctime>

namespace corral {

namespace {

bool parse_digits(std::string_view text, std::size_t pos, std::size_t len, int& out) {
  if (pos + len > text.size()) return false;
  for (std::size_t i = pos; i < pos + len; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  auto [end, ec] = std::from_chars(text.data() + pos, text.data() + pos + len, out);
  return ec == std::errc() && end == text.data() + pos + len;
}

}  // namespace

std::string format_time(TimePoint t) {
  auto ms = to_millis(t);
  std::time_t secs = static_cast<std::time_t>(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  int millis = static_cast<int>(ms - static_cast<std::int64_t>(secs) * 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
  return buf;
}

std::optional<TimePoint> parse_rfc3339(std::string_view t) {
  // YYYY-MM-DDTHH:MM:SS[.fff]Z
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (t.size() < 20 || t[4] != '-' || t[7] != '-' || (t[10] != 'T' && t[10] != 't' && t[10] != ' ') ||
      t[13] != ':' || t[16] != ':') {
    return std::nullopt;
  }
  if (!parse_digits(t, 0, 4, year) || !parse_digits(t, 5, 2, month) || !parse_digits(t, 8, 2, day) ||
      !parse_digits(t, 11, 2, hour) || !parse_digits(t, 14, 2, minute) || !parse_digits(t, 17, 2, second)) {
    return std::nullopt;
  }
  std::size_t pos = 19;
  std::int64_t millis = 0;
  if (pos < t.size() && t[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') {
      if (digits < 3) millis = millis * 10 + (t[pos] - '0');
      ++digits;
      ++pos;
    }
    if (digits == 0) return std::nullopt;
    for (int d = digits; d < 3; ++d) millis *= 10;
  }
  std::int64_t offset_minutes = 0;
  if (pos < t.size() && (t[pos] == 'Z' || t[pos] == 'z')) {
    ++pos;
  } else if (pos + 6 == t.size() && (t[pos] == '+' || t[pos] == '-') && t[pos + 3] == ':') {
    int oh = 0, om = 0;
    if (!parse_digits(t, pos + 1, 2, oh) || !parse_digits(t, pos + 4, 2, om)) return std::nullopt;
    offset_minutes = (t[pos] == '+' ? 1 : -1) * (oh * 60 + om);
    pos += 6;
  } else {
    return std::nullopt;
  }
  if (pos != t.size()) return std::nullopt;
  std::chrono::year_month_day ymd{std::chrono::year(year), std::chrono::month(static_cast<unsigned>(month)),
                                  std::chrono::day(static_cast<unsigned>(day))};
  if (!ymd.ok() || hour > 23 || minute > 59 || second > 60) return std::nullopt;
  auto tp = std::chrono::sys_days(ymd) + std::chrono::hours(hour) + std::chrono::minutes(minute) +
            std::chrono::seconds(second) + std::chrono::milliseconds(millis) -
            std::chrono::minutes(offset_minutes);
  return std::chrono::time_point_cast<Duration>(tp);
}

}  // namespace corral
