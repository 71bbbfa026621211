#pragma once
// Text rules of the job spec that need no YAML: names, numbers, message paths. Shared by
// job_spec_yaml.cpp and submission.cpp; kept apart so the former stays about walking YAML.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace corral::model::spec_text {

// Job names: 1 to 64 of [A-Za-z0-9._-].
bool valid_job_name(std::string_view name);
// Environment variable names: [A-Za-z_][A-Za-z0-9_]*.
bool valid_env_name(std::string_view name);
// Why the job may not set this variable, when corral sets it for every rank itself.
std::optional<std::string> reserved_env_problem(std::string_view name);

// A decimal integer, optionally negative. Values beyond int64 saturate, so range checks
// report them as too large or too small rather than as "not a number".
std::optional<std::int64_t> parse_integer(std::string_view text);
// "40", "39.5": plain decimal notation only; no sign, exponent, nan or inf.
std::optional<double> parse_decimal(std::string_view text);

// A key as it appears in a field path: as written when it is a plain word, quoted
// otherwise, so a hostile key cannot put line breaks or megabytes into a message.
std::string path_component(std::string_view key);
// "resources" + "gpu" -> "resources.gpu"; "" + "name" -> "name".
std::string join_path(std::string_view parent, std::string_view child);
// "a, b, c"
std::string join_names(std::span<const std::string_view> names);

}  // namespace corral::model::spec_text
