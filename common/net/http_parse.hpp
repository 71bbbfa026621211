#pragma once
// The server's reading of one HTTP request as a function of bytes: Beast's parser with
// the server's limits, then the HttpRequest a handler sees. What the fuzz target drives;
// the server reads the same way from its socket (server.cpp).

#include <cstddef>
#include <string_view>

#include "common/core/error.hpp"
#include "common/net/http_types.hpp"

namespace corral::net {

// InvalidArgument with Beast's reason for a malformed request, ResourceExhausted past a
// limit, Unavailable when `bytes` end before the request does.
[[nodiscard]] Result<HttpRequest> parse_http_request(std::string_view bytes, std::size_t max_header_bytes,
                                                     std::size_t max_body_bytes);

}  // namespace corral::net
