#include "common/model/client_config_yaml.hpp"

#include <array>
#include <charconv>
#include <exception>
#include <set>
#include <vector>

#include "common/core/strings.hpp"
#include "common/model/flat_config.hpp"

namespace corral::model {

namespace {

constexpr std::size_t kMaxValueBytes = 4096;
constexpr std::size_t kMaxSocketPathBytes = 107;  // sockaddr_un's sun_path, less its NUL

// "https://HOST:PORT" with an optional trailing slash, or "unix:/PATH" (the coordinator's
// local socket, also written unix:///PATH): what common/net's client accepts. Checked
// here too so that a typo is reported with its line, not at connect time.
std::string check_url(const std::string& v) {
  const std::string bad = "must be https://HOST:PORT or unix:/PATH, got " + quote_for_message(v);
  if (v.starts_with("unix:")) {
    std::string_view path = std::string_view(v).substr(5);
    if (path.starts_with("//")) path.remove_prefix(2);
    if (path.size() > kMaxSocketPathBytes) return "the socket path is longer than 107 bytes";
    return path.starts_with('/') ? "" : bad;
  }
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
  ClientConfig config;
  FlatConfig f(file_name, kMaxClientConfigBytes);
  f.allow_empty();
  f.key("url", [&config](const std::string& v) {
    std::string problem = v.empty() ? "must not be empty" : check_url(v);
    if (problem.empty()) config.url = v;
    return problem;
  });
  f.key("token", [&config](const std::string& v) {
    std::string problem = v.empty() ? "must not be empty" : v.size() > kMaxValueBytes ? "longer than 4096 characters" : check_token(v);
    if (problem.empty()) config.token = v;
    return problem;
  });
  f.key("ca", string_into(config.ca));
  if (auto r = f.parse(yaml); !r) return std::unexpected(r.error());
  return config;
}

}  // namespace corral::model
