#include "worker/flags.hpp"

#include <algorithm>
#include <charconv>

#include "common/core/strings.hpp"

namespace corral::worker {

namespace {

std::unexpected<Error> invalid(std::string message) {
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

}  // namespace

Result<Flags> parse_flags(std::span<const std::string> args, std::span<const std::string_view> known) {
  Flags flags;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (!arg.starts_with("--") || arg.size() == 2)
      return invalid("unexpected argument " + quote_for_message(arg));
    arg.remove_prefix(2);
    std::string_view name = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      auto near = closest_match(name, known);
      return invalid("unknown flag --" + std::string(name) +
                     (near ? " (did you mean --" + std::string(*near) + "?)" : std::string()));
    }
    std::string value;
    if (name.size() < arg.size()) {
      value = std::string(arg.substr(name.size() + 1));
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return invalid("--" + std::string(name) + " needs a value");
    }
    if (!flags.emplace(std::string(name), std::move(value)).second) {
      return invalid("--" + std::string(name) + " is given twice");
    }
  }
  return flags;
}

Result<Duration> parse_timeout(std::string_view flag, std::string_view text) {
  bool plain = !text.empty() && std::all_of(text.begin(), text.end(),
                                            [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
  auto d = parse_seconds_or_duration(text);
  if (plain && (!d || text.find_first_not_of("0.") == std::string_view::npos)) {
    return invalid("--" + std::string(flag) + " " + quote_for_message(text) +
                   " is not a positive number of seconds");
  }
  if (!d) return std::unexpected(d.error().with_context("--" + std::string(flag)));
  return std::max(*d, Duration(1));
}

Result<std::int64_t> parse_integer(std::string_view flag, std::string_view text, std::int64_t min,
                                   std::int64_t max) {
  auto parsed = text.starts_with('-') ? std::nullopt : parse_int<std::int64_t>(text);
  std::int64_t value = parsed.value_or(0);
  if (!parsed || value < min || value > max) {
    return invalid("--" + std::string(flag) + " " + quote_for_message(text) + " is not a whole number from " +
                   std::to_string(min) + " to " + std::to_string(max));
  }
  return value;
}

}  // namespace corral::worker
