#pragma once
// Small string helpers shared by the spec parser, the CLI and the scheduler.

#include <charconv>
#include <concepts>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral {

// A whole decimal number: digits, after a '-' for a signed type, and nothing else,
// within T. The one integer reader for specs, configs, flags, queries and nvidia-smi.
template <std::integral T>
std::optional<T> parse_int(std::string_view text) {
  T value{};
  if (text.empty() || text.front() == '+') return std::nullopt;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

// "90s", "30m", "2h", "1d", or combinations like "1h30m". Positive, at most 365 days.
Result<Duration> parse_duration(std::string_view text);
// A plain number of seconds ("90", "1.5", "0") from 0 to 365 days, else a duration as
// parse_duration reads it. The one reader for --timeout-like flags.
Result<Duration> parse_seconds_or_duration(std::string_view text);
// A moment for --since/--until: a duration back from `now` ("2d", "12h"), a day in UTC
// ("2026-12-01", its midnight), a UTC time ("2026-12-01T10:00" or with seconds), or RFC
// 3339 with a zone. InvalidArgument otherwise.
Result<TimePoint> parse_moment(std::string_view text, TimePoint now);
// The shortest exact form: 90000ms -> "90s", 5400000 -> "1h30m".
std::string format_duration(Duration d);
// The items with `sep` between them.
std::string join(const std::vector<std::string>& items, std::string_view sep);
// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {}.
std::vector<std::string> split(std::string_view text, char sep);
// What follows the last '/': "/usr/bin/python3" -> "python3"; "torchrun" as it is.
std::string_view base_name(std::string_view path);

// Shell-style glob: '*' any run, '?' one character, '[...]' a class. No path semantics.
bool glob_match(std::string_view pattern, std::string_view text);

std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word` when it is close enough to be a likely typo.
std::optional<std::string_view> closest_match(std::string_view word,
                                              std::span<const std::string_view> candidates);

// Quote for messages: "four" with control characters escaped, cut at 40 characters.
std::string quote_for_message(std::string_view text);

}  // namespace corral
