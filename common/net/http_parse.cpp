#include "common/net/http_parse.hpp"

#include <boost/asio/buffer.hpp>
#include <cctype>

#include "common/net/beast_request.hpp"

namespace corral::net {

namespace http = boost::beast::http;

void limit_parser(BeastRequestParser& parser, std::size_t max_header_bytes, std::size_t max_body_bytes) {
  parser.header_limit(static_cast<std::uint32_t>(max_header_bytes));
  parser.body_limit(max_body_bytes);
}

HttpRequest to_request(const BeastRequest& req, const std::string& peer_cn, const std::string& remote) {
  HttpRequest out;
  out.method = std::string(req.method_string());
  out.target = std::string(req.target());
  out.body = req.body();
  out.peer_cn = peer_cn;
  out.remote = remote;
  for (const auto& field : req) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    auto [it, fresh] = out.headers.insert_or_assign(name, std::string(field.value()));
    if (!fresh) out.repeated_headers.push_back(name);
  }
  if (!parse_target(out.target, out.path, out.query)) out.path.clear();
  return out;
}

BeastResponse to_beast_response(HttpResponse res, unsigned version) {
  BeastResponse out(static_cast<http::status>(res.status), version);
  if (!res.content_type.empty()) out.set(http::field::content_type, res.content_type);
  for (auto& [name, value] : res.headers) {
    http::field f = http::string_to_field(name);
    if (f == http::field::content_type || f == http::field::content_length || f == http::field::transfer_encoding ||
        f == http::field::connection || f == http::field::keep_alive) {
      continue;
    }
    out.insert(name, value);
  }
  out.body() = std::move(res.body);
  return out;
}

Result<HttpRequest> parse_http_request(std::string_view bytes, std::size_t max_header_bytes,
                                       std::size_t max_body_bytes) {
  BeastRequestParser parser;
  limit_parser(parser, max_header_bytes, max_body_bytes);
  parser.eager(true);
  boost::beast::error_code ec;
  std::size_t used = 0;
  while (!parser.is_done() && used < bytes.size()) {
    std::size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
      return make_error(ErrorCode::ResourceExhausted, "request too large: " + ec.message());
    }
    if (ec) return make_error(ErrorCode::InvalidArgument, "bad request: " + ec.message());
    if (n == 0) break;
    used += n;
  }
  if (!parser.is_done()) {
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return make_error(ErrorCode::Unavailable, "the request ends early");
  }
  return to_request(parser.release(), "", "");
}

}  // namespace corral::net
