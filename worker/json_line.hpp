#pragma once
// One JSON object on one line: how every corral-worker command reports to the agent and
// to people. Small on purpose, so worker/ needs no JSON library; fields keep the order
// they are added in, which keeps the lines easy to read in rank logs.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "worker/exit_codes.hpp"

namespace corral::worker {

class JsonLine {
 public:
  JsonLine& add(std::string_view key, std::string_view value);
  JsonLine& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  JsonLine& add(std::string_view key, const std::string& value) { return add(key, std::string_view(value)); }
  JsonLine& add(std::string_view key, std::int64_t value);
  JsonLine& add(std::string_view key, int value) { return add(key, std::int64_t{value}); }
  JsonLine& add(std::string_view key, std::uint64_t value);
  // Finite values with up to `decimals` digits after the point; NaN and inf become null.
  JsonLine& add(std::string_view key, double value, int decimals = 3);
  JsonLine& add(std::string_view key, bool value);
  JsonLine& add(std::string_view key, const std::optional<std::string>& value);
  JsonLine& add_null(std::string_view key);
  // `json` must already be valid JSON (an array or object built with JsonLine).
  JsonLine& add_raw(std::string_view key, std::string_view json);

  // "{...}" without a newline.
  std::string str() const { return body_ + "}"; }

 private:
  void key(std::string_view k);

  std::string body_ = "{";
};

// `text` as a JSON string literal, quotes included. Invalid UTF-8 passes through as is:
// the values come from the environment and from CUDA, which are ASCII in practice.
std::string json_quote(std::string_view text);

// The one way a check ends: `json` gets "ok" (and "exit_code" and "error" when it
// failed), goes to stdout as one line, the error also to stderr after `who` ("nccl-check:
// rank 3: "). Returns the exit code for main.
int print_result(JsonLine& json, std::string_view who, const std::optional<Failure>& failure);

// This machine's host name for a check's JSON line, or "unknown".
std::string host_name();

}  // namespace corral::worker
