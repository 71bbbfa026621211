#include "worker/json_line.hpp"

#include <cstdio>

#include <limits.h>
#include <unistd.h>

#include <charconv>
#include <cmath>

namespace corral::worker {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}


std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    auto uc = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (uc < 0x20 || uc == 0x7f) {
          constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[uc >> 4];
          out += kHex[uc & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

void JsonLine::key(std::string_view k) {
  if (body_.size() > 1) body_ += ',';
  body_ += json_quote(k);
  body_ += ':';
}

JsonLine& JsonLine::add(std::string_view k, std::string_view value) {
  key(k);
  body_ += json_quote(value);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, std::int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, std::uint64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, double value, int decimals) {
  key(k);
  if (!std::isfinite(value)) {
    body_ += "null";
    return *this;
  }
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed, decimals);
  body_.append(buf, ec == std::errc() ? ptr : buf);
  if (ec != std::errc()) body_ += "null";
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonLine& JsonLine::add(std::string_view k, const std::optional<std::string>& value) {
  return value ? add(k, std::string_view(*value)) : add_null(k);
}

JsonLine& JsonLine::add_null(std::string_view k) {
  key(k);
  body_ += "null";
  return *this;
}

JsonLine& JsonLine::add_raw(std::string_view k, std::string_view json) {
  key(k);
  body_ += json;
  return *this;
}

int print_result(JsonLine& json, std::string_view who, const std::optional<Failure>& failure) {
  json.add("ok", !failure);
  if (failure) {
    json.add("exit_code", to_int(failure->code)).add("error", failure->message);
    std::fprintf(stderr, "%.*s%s\n", static_cast<int>(who.size()), who.data(), failure->message.c_str());
  }
  std::printf("%s\n", json.str().c_str());
  std::fflush(stdout);
  return to_int(failure ? failure->code : ExitCode::Ok);
}

}  // namespace corral::worker
