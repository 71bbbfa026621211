#pragma once
// FlatConfig: the one reader of corral's flat YAML config files (the coordinator's, the
// agent's and the client's): a map of plain keys to single values, a handler per key.
// Every problem is collected and named with file:line:col and the key: an unknown key
// (with the likely one it misspells), a key set twice, a list or map where a value
// belongs (or a value where a list belongs), what a handler refuses, a required key
// missing.

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral::model {

class FlatConfig {
 public:
  // "" when the value is taken, else what is wrong with it.
  using Handler = std::function<std::string(const std::string& value)>;

  explicit FlatConfig(std::string_view file, std::size_t max_bytes = 256 * 1024) : file_(file), max_bytes_(max_bytes) {}

  void key(std::string name, Handler handler);
  // A key whose value is a list of single values ([a, b] or one "- a" per line; no
  // value at all is an empty list). The handler gets every item.
  using ListHandler = std::function<std::string(const std::vector<std::string>& items)>;
  void list_key(std::string name, ListHandler handler);
  void require(std::string name) { required_.push_back(std::move(name)); }
  // An empty file (or one of comments only) is taken as all defaults.
  void allow_empty() { allow_empty_ = true; }

  Result<void> parse(std::string_view text);

 private:
  std::string file_;
  std::size_t max_bytes_;
  bool allow_empty_ = false;
  std::vector<std::string> names_;
  std::map<std::string, Handler> handlers_;
  std::map<std::string, ListHandler> list_handlers_;
  std::vector<std::string> required_;
};

// Handlers for the common kinds of value.
FlatConfig::Handler string_into(std::string& out, bool allow_empty = false);
FlatConfig::Handler bool_into(bool& out);
FlatConfig::Handler duration_into(Duration& out);
FlatConfig::Handler int_into(long long& out, long long min, long long max);
template <typename T>
FlatConfig::Handler int_into(T& out, long long min, long long max) {
  return [&out, min, max](const std::string& v) -> std::string {
    long long x = 0;
    std::string problem = int_into(x, min, max)(v);
    if (problem.empty()) out = static_cast<T>(x);
    return problem;
  };
}

}  // namespace corral::model
