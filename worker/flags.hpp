#pragma once
// Command-line flags of corral-worker's subcommands: "--name value" or "--name=value",
// each at most once, only the names a command knows. Values are converted by the helpers
// below so that every command reports a bad value the same way.

#include <map>
#include <span>
#include <string>
#include <string_view>

#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral::worker {

using Flags = std::map<std::string, std::string, std::less<>>;

// `known` lists names without dashes. Every flag takes a value.
[[nodiscard]] Result<Flags> parse_flags(std::span<const std::string> args,
                                        std::span<const std::string_view> known);

// Seconds, possibly fractional ("60", "0.5"), or a duration ("500ms", "2m"). Positive.
[[nodiscard]] Result<Duration> parse_timeout(std::string_view flag, std::string_view text);
// A whole number in [min, max].
[[nodiscard]] Result<std::int64_t> parse_integer(std::string_view flag, std::string_view text,
                                                 std::int64_t min, std::int64_t max);

}  // namespace corral::worker
