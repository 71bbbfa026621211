#include "common/net/http_types.hpp"

#include "common/core/hex.hpp"

#include <cctype>
#include <string_view>

namespace corral::net {

namespace {

bool decode(std::string_view in, std::string& out, bool plus_is_space) {
  out.clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      int hi = hex_digit_value(in[i + 1]);
      int lo = hex_digit_value(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return true;
}

}  // namespace

bool parse_target(const std::string& target, std::string& path, std::map<std::string, std::string>& query) {
  auto q = target.find('?');
  if (!decode(std::string_view(target).substr(0, q), path, false)) return false;
  query.clear();
  if (q == std::string::npos) return true;
  std::string_view rest = std::string_view(target).substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    std::string key;
    std::string value;
    if (!decode(pair.substr(0, eq), key, true)) return false;
    if (eq != std::string_view::npos && !decode(pair.substr(eq + 1), value, true)) return false;
    query[key] = value;
  }
  return true;
}

std::string percent_encode(const std::string& text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  return out;
}

}  // namespace corral::net

namespace corral::net {

std::optional<std::string> parse_unix_url(const std::string& url) {
  constexpr std::string_view kScheme = "unix:";
  if (url.rfind(kScheme, 0) != 0) return std::nullopt;
  std::string path = url.substr(kScheme.size());
  if (path.rfind("//", 0) == 0) path.erase(0, 2);  // unix:///run/x.sock, as Docker writes it
  if (path.empty() || path.front() != '/') return std::nullopt;
  return path;
}

std::optional<Url> parse_https_url(const std::string& url) {
  constexpr std::string_view kScheme = "https://";
  if (url.rfind(kScheme, 0) != 0) return std::nullopt;
  std::string rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.find('/') != std::string::npos) return std::nullopt;
  Url out;
  std::string port;
  if (rest.front() == '[') {  // [::1]:7433
    auto close = rest.find(']');
    if (close == std::string::npos) return std::nullopt;
    out.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') return std::nullopt;
      port = rest.substr(close + 2);
    }
  } else {
    auto colon = rest.rfind(':');
    out.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (out.host.empty()) return std::nullopt;
  if (!port.empty()) {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    out.port = std::stoi(port);
    if (out.port < 1 || out.port > 65535) return std::nullopt;
  }
  return out;
}

}  // namespace corral::net
