#include "common/net/blocking_http.hpp"

#include <poll.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "common/net/beast_request.hpp"

namespace corral::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// Beast's own default: what a command's headers need, many times over.
constexpr std::size_t kMaxHeaderBytes = 8 * 1024;

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
    BeastRequestParser parser;
    limit_parser(parser, kMaxHeaderBytes, max_body);
    stream.expires_after(timeout);
    http::async_read(stream, buffer, parser, [&ec](beast::error_code e, std::size_t) { ec = e; });
    finish();
    if (ec) break;
    auto req = parser.release();
    // A sender that has gone since (closed its end: a command interrupted, or one that
    // gave up waiting) gets nothing done for it.
    pollfd gone{stream.socket().native_handle(), POLLRDHUP, 0};
    if (::poll(&gone, 1, 0) > 0 && (gone.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) break;
    HttpRequest in = to_request(req, "", "");
    auto res = to_beast_response(handle(in), req.version());
    res.keep_alive(req.keep_alive());
    res.prepare_payload();
    stream.expires_after(timeout);
    http::async_write(stream, res, [&ec](beast::error_code e, std::size_t) { ec = e; });
    finish();
    if (!req.keep_alive()) break;
  }
}

}  // namespace corral::net
