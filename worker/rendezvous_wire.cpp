#include "worker/rendezvous_wire.hpp"

#include <algorithm>
#include <charconv>
#include <map>

#include "common/core/strings.hpp"

namespace corral::worker {

namespace {

std::unexpected<Error> invalid(std::string message) {
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

// Checks the first word; returns the rest of the line.
Result<std::string_view> strip_magic(std::string_view line, std::string_view what) {
  std::size_t space = line.find(' ');
  std::string_view first = line.substr(0, space);
  if (first != kWireMagic) {
    if (first.starts_with("corral-tcp-check/")) {
      return invalid(std::string(what) + " speaks " + quote_for_message(first) + ", this worker speaks " +
                     std::string(kWireMagic));
    }
    return invalid(std::string("not a corral tcp-check ") + std::string(what) + ": it starts " +
                   quote_for_message(line.substr(0, 24)));
  }
  return space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
}

Result<std::int64_t> to_number(std::string_view key, std::string_view text, std::int64_t max) {
  std::int64_t v = 0;
  bool digits =
      !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (!digits || ec != std::errc() || ptr != text.data() + text.size() || v > max) {
    return invalid("field " + std::string(key) + "=" + quote_for_message(text) + " is not a number");
  }
  return v;
}

}  // namespace

std::string format_hello(const Hello& h) {
  return std::string(kWireMagic) + " rank=" + std::to_string(h.rank) +
         " world_size=" + std::to_string(h.world_size) + " master_addr=" + h.master_addr +
         " master_port=" + std::to_string(h.master_port) + " job=" + std::to_string(h.job_id) +
         " attempt=" + std::to_string(h.attempt) + " value=" + std::to_string(h.value) + "\n";
}

Result<Hello> parse_hello(std::string_view line) {
  if (line.size() >= kMaxLineBytes)
    return invalid("hello longer than " + std::to_string(kMaxLineBytes) + " bytes");
  auto rest = strip_magic(line, "hello");
  if (!rest) return std::unexpected(rest.error());
  std::map<std::string, std::string, std::less<>> fields;
  std::string_view text = *rest;
  while (!text.empty()) {
    std::size_t space = text.find(' ');
    std::string_view token = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    if (token.empty()) continue;
    std::size_t eq = token.find('=');
    if (eq == std::string_view::npos)
      return invalid("hello has a word without '=': " + quote_for_message(token));
    if (!fields.emplace(std::string(token.substr(0, eq)), std::string(token.substr(eq + 1))).second) {
      return invalid("hello repeats " + quote_for_message(token.substr(0, eq)));
    }
  }
  for (std::string_view required :
       {"rank", "world_size", "master_addr", "master_port", "job", "attempt", "value"}) {
    if (!fields.contains(required)) return invalid("hello lacks " + std::string(required));
  }
  Hello h;
  constexpr std::int64_t kMaxInt = 999'999'999;
  constexpr std::int64_t kMaxLong = 999'999'999'999'999'999;
  struct IntField {
    std::string_view key;
    int* target;
  };
  for (auto [key, target] : {IntField{"rank", &h.rank}, IntField{"world_size", &h.world_size},
                             IntField{"master_port", &h.master_port}, IntField{"attempt", &h.attempt}}) {
    auto v = to_number(key, fields.find(key)->second, kMaxInt);
    if (!v) return std::unexpected(v.error());
    *target = static_cast<int>(*v);
  }
  auto job = to_number("job", fields.find("job")->second, kMaxLong);
  if (!job) return std::unexpected(job.error());
  h.job_id = *job;
  auto value = to_number("value", fields.find("value")->second, kMaxLong);
  if (!value) return std::unexpected(value.error());
  h.value = *value;
  h.master_addr = fields.find("master_addr")->second;
  if (h.master_addr.empty()) return invalid("hello has an empty master_addr");
  return h;
}

std::string format_reply(const Reply& r) {
  if (r.kind == Reply::Kind::Ok) return std::string(kWireMagic) + " ok sum=" + std::to_string(r.sum) + "\n";
  std::string head = std::string(kWireMagic) + (r.kind == Reply::Kind::Refused ? " refused " : " timeout ");
  std::string message = r.message;
  std::replace_if(
      message.begin(), message.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  std::size_t room = kMaxLineBytes - head.size() - 1;
  if (message.size() > room) message.resize(room);
  return head + message + "\n";
}

Result<Reply> parse_reply(std::string_view line) {
  if (line.size() >= kMaxLineBytes)
    return invalid("reply longer than " + std::to_string(kMaxLineBytes) + " bytes");
  auto rest = strip_magic(line, "reply");
  if (!rest) return std::unexpected(rest.error());
  Reply r;
  if (rest->starts_with("ok sum=")) {
    auto v = to_number("sum", rest->substr(7), 999'999'999'999'999'999);
    if (!v) return std::unexpected(v.error());
    r.sum = *v;
    return r;
  }
  for (auto [word, kind] : {std::pair{std::string_view("refused "), Reply::Kind::Refused},
                            std::pair{std::string_view("timeout "), Reply::Kind::TimedOut}}) {
    if (rest->starts_with(word)) {
      r.kind = kind;
      r.message = std::string(rest->substr(word.size()));
      return r;
    }
  }
  return invalid("reply is not ok, refused or timeout: " + quote_for_message(*rest));
}

}  // namespace corral::worker
