#include "common/model/client_config_yaml.hpp"

#include <array>
#include <charconv>
#include <exception>
#include <set>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/core/strings.hpp"

namespace corral::model {

namespace {

constexpr std::array<std::string_view, 3> kKeys = {"url", "token", "ca"};
constexpr std::size_t kMaxValueBytes = 4096;

std::string position(std::string_view file, const YAML::Mark& mark) {
  std::string where(file);
  if (mark.line >= 0 && mark.column >= 0) {
    where += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }
  return where;
}

// "https://HOST:PORT" with an optional trailing slash: what common/net's client accepts.
// Checked here too so that a typo is reported with its line, not at connect time.
std::string check_url(const std::string& v) {
  const std::string bad = "must be https://HOST:PORT, got " + quote_for_message(v);
  constexpr std::string_view kScheme = "https://";
  if (!v.starts_with(kScheme)) return bad;
  std::string_view rest = std::string_view(v).substr(kScheme.size());
  if (rest.ends_with('/')) rest.remove_suffix(1);
  auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad;
  std::string_view port = rest.substr(colon + 1);
  auto p = parse_int<int>(port);
  if (!p || *p < 1 || *p > 65535) return bad;
  return "";
}

// The token goes into an HTTP header: anything but visible ASCII would corrupt it.
std::string check_token(const std::string& v) {
  for (char c : v) {
    if (c <= ' ' || c >= 0x7f) return "must be visible ASCII characters without spaces";
  }
  return "";
}

}  // namespace

Result<ClientConfig> parse_client_config(std::string_view yaml, std::string_view file_name) {
  if (yaml.size() > kMaxClientConfigBytes) {
    return make_error(ErrorCode::InvalidArgument, std::string(file_name) + ": file is " +
                                                      std::to_string(yaml.size()) + " bytes; the limit is " +
                                                      std::to_string(kMaxClientConfigBytes));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return make_error(ErrorCode::InvalidArgument, position(file_name, e.mark) + ": " + e.msg);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::InvalidArgument, std::string(file_name) + ": " + e.what());
  }
  ClientConfig config;
  if (!root.IsDefined() || root.IsNull()) return config;
  if (!root.IsMap()) {
    return make_error(ErrorCode::InvalidArgument,
                      position(file_name, root.Mark()) + ": must be a map of settings (url, token, ca)");
  }
  std::vector<std::string> problems;
  std::set<std::string> seen;
  try {
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      const std::string where = position(file_name, key.Mark()) + ": ";
      if (!key.IsScalar()) {
        problems.push_back(where + "keys must be plain names (url, token, ca)");
        continue;
      }
      const std::string name = key.Scalar();
      std::string* target = name == "url"     ? &config.url
                            : name == "token" ? &config.token
                            : name == "ca"    ? &config.ca
                                              : nullptr;
      if (target == nullptr) {
        std::string message = where + quote_for_message(name) + ": unknown setting";
        if (auto near = closest_match(name, kKeys))
          message += "; did you mean \"" + std::string(*near) + "\"?";
        problems.push_back(message);
        continue;
      }
      if (!seen.insert(name).second) {
        problems.push_back(where + name + ": set twice");
        continue;
      }
      // An empty value is marked where the next token starts; point at its key instead.
      const std::string value_where = position(file_name, value.IsNull() ? key.Mark() : value.Mark()) + ": ";
      if (!value.IsScalar() || value.Scalar().empty()) {
        problems.push_back(value_where + name + ": must be a single non-empty value");
        continue;
      }
      const std::string& v = value.Scalar();
      std::string problem;
      if (v.size() > kMaxValueBytes) {
        problem = "longer than " + std::to_string(kMaxValueBytes) + " bytes";
      } else if (name == "url") {
        problem = check_url(v);
      } else if (name == "token") {
        problem = check_token(v);
      }
      if (!problem.empty()) {
        problems.push_back(value_where + name + ": " + problem);
        continue;
      }
      *target = v;
    }
  } catch (const std::exception& e) {
    problems.push_back(std::string(file_name) + ": " + e.what());
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
    return make_error(ErrorCode::InvalidArgument, all);
  }
  return config;
}

}  // namespace corral::model
