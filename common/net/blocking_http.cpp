#include "common/net/blocking_http.hpp"

#include <poll.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>

namespace corral::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// Set from the answer itself, never copied from its headers.
bool set_here(http::field f) {
  return f == http::field::connection || f == http::field::content_length || f == http::field::transfer_encoding ||
         f == http::field::keep_alive || f == http::field::content_type;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

void serve_http_blocking(int fd, const std::function<HttpResponse(HttpRequest&)>& handle, std::size_t max_body,
                         Duration timeout) {
  asio::io_context io(1);
  // Blocking in effect: each operation runs the private io_context to its end, so that the
  // stream's expiry bounds it (Asio's synchronous reads would ignore SO_RCVTIMEO).
  beast::basic_stream<asio::local::stream_protocol> stream(io);
  boost::system::error_code ec;
  stream.socket().assign(asio::local::stream_protocol(), fd, ec);
  if (ec) {
    ::close(fd);
    return;
  }
  auto finish = [&io] {
    io.restart();
    io.run();
  };
  beast::flat_buffer buffer;
  while (!ec) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(max_body);
    stream.expires_after(timeout);
    http::async_read(stream, buffer, parser, [&ec](beast::error_code e, std::size_t) { ec = e; });
    finish();
    if (ec) break;
    auto req = parser.release();
    // A sender that has gone since (closed its end: a command interrupted, or one that
    // gave up waiting) gets nothing done for it.
    pollfd gone{stream.socket().native_handle(), POLLRDHUP, 0};
    if (::poll(&gone, 1, 0) > 0 && (gone.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) break;
    HttpRequest in;
    in.method = std::string(req.method_string());
    in.target = std::string(req.target());
    for (const auto& f : req) {
      std::string name = lowercase(f.name_string());
      if (in.headers.contains(name)) in.repeated_headers.push_back(name);
      in.headers[name] = std::string(f.value());
    }
    in.body = std::move(req.body());
    HttpResponse out = handle(in);
    http::response<http::string_body> res(static_cast<http::status>(out.status), 11);
    if (!out.content_type.empty()) res.set(http::field::content_type, out.content_type);
    for (const auto& [name, value] : out.headers) {
      if (!set_here(http::string_to_field(name))) res.insert(name, value);
    }
    res.body() = std::move(out.body);
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    stream.expires_after(timeout);
    http::async_write(stream, res, [&ec](beast::error_code e, std::size_t) { ec = e; });
    finish();
    if (!req.keep_alive()) break;
  }
}

}  // namespace corral::net
