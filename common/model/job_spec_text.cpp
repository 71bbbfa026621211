#include "common/model/job_spec_text.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <limits>
#include <system_error>

#include "common/core/strings.hpp"
#include "common/model/job_spec_yaml.hpp"

namespace corral::model {

namespace spec_text {

namespace {

constexpr std::size_t kMaxNameBytes = 64;
// What corral hands every rank itself: a job that set them would break rendezvous.
constexpr std::array<std::string_view, 18> kReservedEnv = {
    "RANK",        "WORLD_SIZE",       "LOCAL_RANK",          "LOCAL_WORLD_SIZE",
    "NODE_RANK",   "GROUP_RANK",       "GROUP_WORLD_SIZE",    "ROLE_RANK",
    "ROLE_NAME",   "ROLE_WORLD_SIZE",  "MASTER_ADDR",         "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",  "TORCHELASTIC_USE_AGENT_STORE"};
constexpr std::string_view kReservedEnvPrefix = "CORRAL_";

bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '-';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

bool valid_job_name(std::string_view name) {
  return !name.empty() && name.size() <= kMaxNameBytes && std::all_of(name.begin(), name.end(), is_word_char);
}

bool valid_env_name(std::string_view name) {
  if (name.empty() || is_digit(name.front())) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '_';
  });
}

std::optional<std::string> reserved_env_problem(std::string_view name) {
  if (name.starts_with(kReservedEnvPrefix)) return "corral sets CORRAL_* variables itself; remove it";
  if (std::find(kReservedEnv.begin(), kReservedEnv.end(), name) != kReservedEnv.end()) {
    return "corral sets " + std::string(name) + " itself for every rank; remove it";
  }
  return std::nullopt;
}

std::optional<std::int64_t> parse_integer(std::string_view text) {
  if (auto value = parse_int<std::int64_t>(text)) return value;
  // Past int64's range: the largest or smallest, so that the field's own bound names it.
  bool negative = !text.empty() && text.front() == '-';
  std::string_view digits = negative ? text.substr(1) : text;
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), is_digit)) return std::nullopt;
  return negative ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
}

std::optional<double> parse_decimal(std::string_view text) {
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(), [](char c) { return is_digit(c) || c == '.'; })) {
    return std::nullopt;
  }
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::fixed);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string path_component(std::string_view key) {
  bool plain =
      !key.empty() && key.size() <= kMaxNameBytes && std::all_of(key.begin(), key.end(), is_word_char);
  return plain ? std::string(key) : quote_for_message(key);
}

std::string join_path(std::string_view parent, std::string_view child) {
  std::string out(parent);
  if (!out.empty()) out += '.';
  out += child;
  return out;
}

std::string join_names(std::span<const std::string_view> names) {
  std::string out;
  for (auto name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

}  // namespace spec_text

// Problems without a position (line 0) read "file: path: message": no ":0:0" that an
// editor would jump to.
std::string SpecProblem::format(std::string_view file_name) const {
  std::string out(file_name);
  if (line > 0) out += ':' + std::to_string(line) + ':' + std::to_string(column);
  out += ": ";
  if (!path.empty()) out += path + ": ";
  out += message;
  return out;
}

}  // namespace corral::model
