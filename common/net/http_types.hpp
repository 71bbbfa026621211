#pragma once
// Plain HTTP request/response values handed between common/net and the application.

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace corral::net {

struct HttpRequest {
  std::string method;                          // "GET"
  std::string target;                          // "/v1/jobs?all=1"
  std::string path;                            // "/v1/jobs", percent-decoded
  std::map<std::string, std::string> query;    // decoded
  std::map<std::string, std::string> headers;  // lowercase names; the last of a repeated one
  std::vector<std::string> repeated_headers;   // each name seen again, once per repeat
  std::string body;
  std::string peer_cn;                         // CN of a client certificate the CA verified, else empty
  std::string remote;                          // "127.0.0.1:51234"

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
  // How many times the request carried this header.
  std::size_t header_count(const std::string& lower_name) const {
    if (!headers.contains(lower_name)) return 0;
    return 1 + static_cast<std::size_t>(std::count(repeated_headers.begin(), repeated_headers.end(), lower_name));
  }
};

// The body of a streamed answer (server-sent events), written piece by piece as things
// happen. Lives on the loop thread; safe to keep after it closed (sends are dropped).
class EventStream {
 public:
  virtual ~EventStream() = default;
  // Queues bytes of the body. The stream is closed when its queue passes the limit (a
  // reader that does not read must not grow the daemon's memory).
  virtual void send(std::string text) = 0;
  virtual void close() = 0;
  // False once either side closed it.
  virtual bool open() const = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Set: the answer is a stream. The head goes out (no length; the body ends when the
  // connection does), `body` first, then `stream` is called with the stream to write to.
  std::function<void(std::shared_ptr<EventStream>)> stream = nullptr;
};

// Splits "/a/b?x=1&y=%20" into a decoded path and query map. False on bad escapes.
bool parse_target(const std::string& target, std::string& path, std::map<std::string, std::string>& query);
std::string percent_encode(const std::string& text);

}  // namespace corral::net

namespace corral::net {

struct Url {
  std::string host;
  int port = 443;
};
// "https://host:port" (a trailing slash is allowed). Only https.
std::optional<Url> parse_https_url(const std::string& url);
// "unix:/path" or "unix:///path": the coordinator's local socket, as its path; nullopt for
// any other URL (or a path that is not absolute).
std::optional<std::string> parse_unix_url(const std::string& url);

}  // namespace corral::net
