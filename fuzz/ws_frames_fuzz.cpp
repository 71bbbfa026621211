// WebSocket frames as the coordinator's server reads an agent's link: Beast's server
// stream after an upgrade, with the server's message limit, fed the input as what the
// client sent; each text message is then decoded as an agent message.
#include <boost/asio/io_context.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include "common/protocol/codec.hpp"
#include "fuzz/fuzz_input.hpp"

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  boost::asio::io_context io;
  beast::test::stream server(io);
  beast::test::stream client(io);
  server.connect(client);
  websocket::stream<beast::test::stream&> ws(server);
  ws.read_message_max(4 * 1024 * 1024);  // ServerOptions::max_ws_message_bytes
  http::request<http::string_body> upgrade{http::verb::get, "/v1/agent", 11};
  upgrade.set(http::field::host, "coordinator");
  upgrade.set(http::field::upgrade, "websocket");
  upgrade.set(http::field::connection, "upgrade");
  upgrade.set(http::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
  upgrade.set(http::field::sec_websocket_version, "13");
  beast::error_code ec;
  ws.accept(upgrade, ec);
  if (ec) std::abort();  // a valid upgrade is always accepted
  auto input = corral::fuzz::text(data, size);
  server.append(beast::string_view(input.data(), input.size()));
  client.close();  // then the client is gone: reads end
  beast::flat_buffer buffer;
  for (int messages = 0; messages < 64; ++messages) {
    ws.read(buffer, ec);
    if (ec) break;
    if (ws.got_text()) (void)corral::protocol::decode_agent_message(beast::buffers_to_string(buffer.data()));
    buffer.consume(buffer.size());
  }
  return 0;
}
