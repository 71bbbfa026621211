#include "common/core/strings.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <vector>

namespace corral {

Result<Duration> parse_seconds_or_duration(std::string_view text) {
  bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.';
  });
  if (!plain) return parse_duration(text);
  double seconds = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec != std::errc() || ptr != text.data() + text.size() || seconds > 365.0 * 24 * 3600) {
    return make_error(ErrorCode::InvalidArgument,
                      "expected seconds from 0 to 365 days or a duration like 90s, got " + quote_for_message(text));
  }
  return Duration(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

Result<Duration> parse_duration(std::string_view text) {
  if (text.empty()) {
    return make_error(ErrorCode::InvalidArgument, "empty duration");
  }
  std::int64_t total_ms = 0;
  std::size_t pos = 0;
  constexpr std::int64_t kMaxMs = 365LL * 24 * 3600 * 1000;
  while (pos < text.size()) {
    std::int64_t value = 0;
    const char* begin = text.data() + pos;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc() || ptr == begin) {
      return make_error(ErrorCode::InvalidArgument,
                        "expected a duration like 90s, 30m, 2h or 1d, got " + quote_for_message(text));
    }
    pos = static_cast<std::size_t>(ptr - text.data());
    if (value > kMaxMs) {
      return make_error(ErrorCode::InvalidArgument, "duration too long: " + quote_for_message(text));
    }
    std::int64_t unit_ms = 0;
    if (text.substr(pos, 2) == "ms") {
      unit_ms = 1;
      pos += 2;
    } else if (pos < text.size()) {
      switch (text[pos]) {
        case 's': unit_ms = 1000; break;
        case 'm': unit_ms = 60 * 1000; break;
        case 'h': unit_ms = 3600 * 1000; break;
        case 'd': unit_ms = 24 * 3600 * 1000; break;
        default: break;
      }
      if (unit_ms != 0) ++pos;
    }
    if (unit_ms == 0) {
      return make_error(ErrorCode::InvalidArgument,
                        "missing unit (s, m, h or d) in duration " + quote_for_message(text));
    }
    total_ms += value * unit_ms;
    if (total_ms > kMaxMs) {
      return make_error(ErrorCode::InvalidArgument,
                        "duration longer than 365d: " + quote_for_message(text));
    }
  }
  if (total_ms <= 0) {
    return make_error(ErrorCode::InvalidArgument, "duration must be positive, got " + quote_for_message(text));
  }
  return Duration(total_ms);
}

Result<TimePoint> parse_moment(std::string_view text, TimePoint now) {
  if (auto d = parse_duration(text)) return now - *d;
  std::string t(text);
  if (t.size() == 10) t += "T00:00:00Z";                      // a day
  else if (t.size() == 16) t += ":00Z";                      // to the minute
  else if (t.size() == 19) t += "Z";                         // to the second
  if (t.size() <= 40) {
    if (auto at = parse_rfc3339(t)) return *at;
  }
  return make_error(ErrorCode::InvalidArgument,
                    "expected a duration back from now like 2d or 12h, or a date like 2026-12-01 or "
                    "2026-12-01T10:00 (UTC), got " + quote_for_message(text));
}

std::string_view base_name(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  if (text.empty()) return parts;
  for (;;) {
    auto at = text.find(sep);
    parts.emplace_back(text.substr(0, at));
    if (at == std::string_view::npos) return parts;
    text.remove_prefix(at + 1);
  }
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

std::string format_duration(Duration d) {
  std::int64_t ms = d.count();
  if (ms == 0) return "0s";
  std::string out;
  if (ms < 0) {
    out += '-';
    ms = -ms;
  }
  struct Unit {
    std::int64_t ms;
    const char* suffix;
  };
  constexpr Unit kUnits[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}};
  for (const auto& unit : kUnits) {
    if (ms >= unit.ms) {
      out += std::to_string(ms / unit.ms);
      out += unit.suffix;
      ms %= unit.ms;
    }
  }
  return out;
}

namespace {

// Matches one bracket class starting at pattern[pi] == '['; returns the index after ']'
// or npos when the class is unterminated (then '[' is literal).
std::size_t match_class(std::string_view pattern, std::size_t pi, char c, bool& matched) {
  std::size_t i = pi + 1;
  bool negate = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negate = true;
    ++i;
  }
  bool any = false;
  bool first = true;
  while (i < pattern.size() && (first || pattern[i] != ']')) {
    first = false;
    char lo = pattern[i];
    char hi = lo;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      hi = pattern[i + 2];
      i += 2;
    }
    if (c >= lo && c <= hi) any = true;
    ++i;
  }
  if (i >= pattern.size()) return std::string_view::npos;
  matched = any != negate;
  return i + 1;
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) {
  std::size_t pi = 0;
  std::size_t ti = 0;
  std::size_t star_pi = std::string_view::npos;
  std::size_t star_ti = 0;
  while (ti < text.size()) {
    if (pi < pattern.size()) {
      char p = pattern[pi];
      if (p == '*') {
        star_pi = pi++;
        star_ti = ti;
        continue;
      }
      if (p == '?') {
        ++pi;
        ++ti;
        continue;
      }
      if (p == '[') {
        bool matched = false;
        std::size_t next = match_class(pattern, pi, text[ti], matched);
        if (next != std::string_view::npos) {
          if (matched) {
            pi = next;
            ++ti;
            continue;
          }
        } else if (text[ti] == '[') {
          ++pi;
          ++ti;
          continue;
        }
      } else if (p == text[ti]) {
        ++pi;
        ++ti;
        continue;
      }
    }
    if (star_pi == std::string_view::npos) return false;
    pi = star_pi + 1;
    ti = ++star_ti;
  }
  while (pi < pattern.size() && pattern[pi] == '*') ++pi;
  return pi == pattern.size();
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1);
  std::vector<std::size_t> cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<std::string_view> closest_match(std::string_view word,
                                              std::span<const std::string_view> candidates) {
  std::optional<std::string_view> best;
  std::size_t best_distance = 0;
  for (auto candidate : candidates) {
    std::size_t d = edit_distance(word, candidate);
    if (!best || d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  // A typo: at most a third of the word wrong, and at most 3 edits.
  std::size_t limit = std::min<std::size_t>(3, std::max<std::size_t>(1, word.size() / 3));
  if (best && best_distance <= limit) return best;
  return std::nullopt;
}

std::string quote_for_message(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out = "\"";
  std::size_t n = 0;
  for (char c : text) {
    if (n++ == kMax) {
      out += "...";
      break;
    }
    auto uc = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (uc < 0x20 || uc == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[uc >> 4];
      out += kHex[uc & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace corral
