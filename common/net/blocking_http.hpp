#pragma once
// HTTP/1.1 served on one connected socket with blocking I/O, one request at a time on
// the calling thread: for a small process that gives each connection a thread (the CLI's
// connection keeper), not for a daemon's event loop (server.hpp).

#include <functional>

#include "common/core/time.hpp"
#include "common/net/http_types.hpp"

namespace corral::net {

// Takes `fd` over (and closes it) and answers each request with `handle` until the peer
// closes (a request whose sender closed its end after sending it is not handled), asks to close, sends what is not HTTP or a body over `max_body` bytes, or takes
// longer than `timeout` to send a whole request (or to take an answer).
// The request is read as the server reads one (to_request: lowercase header names, the
// target decoded); the answer written as the server writes one (to_beast_response);
// `stream` is not supported.
void serve_http_blocking(int fd, const std::function<HttpResponse(HttpRequest&)>& handle, std::size_t max_body,
                         Duration timeout);

}  // namespace corral::net
