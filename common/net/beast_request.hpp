#pragma once
// Inside common/net only (it includes Beast): the HttpRequest a handler sees, made from
// what Beast's parser read, and the parser set up with the server's limits. The server
// and parse_http_request (the fuzz target's entry) share both.

#include <boost/beast/http.hpp>
#include <optional>
#include <string>

#include "common/net/http_types.hpp"

namespace corral::net {

using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;
using BeastRequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
using BeastResponse = boost::beast::http::response<boost::beast::http::string_body>;

void limit_parser(BeastRequestParser& parser, std::size_t max_header_bytes, std::size_t max_body_bytes);

// Lowercase header names, repeats noted, the target split and decoded (an empty path when
// it does not decode).
HttpRequest to_request(const BeastRequest& req, const std::string& peer_cn, const std::string& remote);

// The answer as Beast writes it: status, Content-Type, `headers` (but for the ones that
// describe the message itself: Content-Type, Content-Length, Transfer-Encoding,
// Connection, Keep-Alive, which come from the answer, not from what a handler or a
// relayed server said) and body. The caller sets keep-alive and prepares the payload.
BeastResponse to_beast_response(HttpResponse res, unsigned version);

}  // namespace corral::net
