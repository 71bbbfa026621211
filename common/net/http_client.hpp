#pragma once
// HttpClient: a blocking HTTPS client on one keep-alive connection, for the CLI and
// benchmarks; or plain HTTP on the coordinator's local socket (a unix: URL), which needs
// no TLS at all. Not thread-safe; one per thread. Owns its own I/O context.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/net/http_types.hpp"

namespace corral::net {

struct ClientTls {
  std::string ca;    // verifies the server
  std::string cert;  // optional client certificate
  std::string key;
  // Optional: a file (mode 0600) that keeps the server's latest TLS session ticket, so
  // that the next process resumes it instead of a full handshake. A file that is missing,
  // unreadable, for another URL, CA or certificate, or expired is ignored.
  std::string session_file = {};
};

// For a short-lived process (the CLI): OpenSSL's teardown at exit, a tenth of a TLS
// command's instructions, is not run; the kernel frees the memory anyway. Call before any
// TLS use.
void skip_tls_teardown_at_exit();

class HttpClient {
 public:
  // InvalidArgument when the URL is neither https://host:port nor unix:/path; `tls` is
  // not used (nor read) for a unix: URL.
  // With `peer_is_me`, a unix: URL's server must run as this process's user (SO_PEERCRED),
  // or the connection fails with PermissionDenied before anything is sent to it.
  static Result<std::unique_ptr<HttpClient>> create(const std::string& url, ClientTls tls,
                                                    Duration timeout = std::chrono::seconds(30),
                                                    bool peer_is_me = false);
  ~HttpClient();

  // Connects now instead of at the first request: Unavailable (or Timeout, or for TLS a
  // failed handshake) when the server cannot be reached. Nothing is sent.
  Result<void> connect();

  // One request. A kept-alive connection the server has closed is replaced before the
  // request is sent; one closed as it was sent is replaced and the request sent again when
  // the server cannot have acted on it (not all of it was written, or it is not a POST or
  // PATCH), or when acting on it twice is safe (it carries an Idempotency-Key).
  // Unavailable when the server cannot be reached, the TLS handshake fails or no answer
  // came; Timeout past the limit.
  Result<HttpResponse> request(const std::string& method, const std::string& target, const std::string& body = {},
                               const std::vector<std::pair<std::string, std::string>>& headers = {});

  // After a failed request: whether the server surely did not act on it (no connection,
  // or not all of it written), so that it may be sent elsewhere.
  bool last_request_unsent() const;

 private:
  struct Impl;
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace corral::net
