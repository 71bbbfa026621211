#pragma once
// Server: one TLS listener speaking HTTP/1.1 and, on one path, WebSocket. Beast's
// advanced-server shape: a listener, one session per connection, a deadline on every
// handshake, read and write, one write in flight with a bounded queue. Everything runs
// on the EventLoop's thread; handlers are called there and must not block for long.

#include <functional>
#include <memory>
#include <string>

#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/net/event_loop.hpp"
#include "common/net/http_types.hpp"

namespace corral::net {

struct TlsFiles {
  std::string ca;    // verifies client certificates (agents); may be empty for client-less servers
  std::string cert;
  std::string key;
};

// A WebSocket peer. Lives on the loop thread; safe to keep after close (sends are dropped).
class WsConnection {
 public:
  virtual ~WsConnection() = default;
  // Queues a text message. The connection is closed when its queue passes the limit
  // (a peer that does not read must not grow the daemon's memory).
  virtual void send(std::string text) = 0;
  virtual void close(const std::string& reason) = 0;
  virtual bool open() const = 0;
  virtual const std::string& peer_cn() const = 0;
  virtual const std::string& remote() const = 0;
};

class ServerHandler {
 public:
  virtual ~ServerHandler() = default;
  // Answer by calling `respond` exactly once, now or later (on the loop thread).
  virtual void on_http(const HttpRequest& request, std::function<void(HttpResponse)> respond) = 0;
  // A WebSocket upgrade on ServerOptions::ws_path: an error refuses it (401/403 by code).
  virtual Result<void> accept_ws(const HttpRequest& request) = 0;
  virtual void on_ws_open(const std::shared_ptr<WsConnection>& conn) = 0;
  virtual void on_ws_message(const std::shared_ptr<WsConnection>& conn, std::string text) = 0;
  virtual void on_ws_close(const std::shared_ptr<WsConnection>& conn) = 0;
};

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;                                      // 0: any free port
  TlsFiles tls;
  std::string ws_path = "/v1/agent";
  std::size_t max_header_bytes = 16 * 1024;
  std::size_t max_body_bytes = 1024 * 1024;
  std::size_t max_ws_message_bytes = 4 * 1024 * 1024;
  std::size_t max_ws_queue_bytes = 64 * 1024 * 1024;
  std::size_t max_connections = 512;
  Duration handshake_timeout = std::chrono::seconds(10);
  Duration idle_timeout = std::chrono::seconds(120);    // HTTP keep-alive between requests
  Duration io_timeout = std::chrono::seconds(30);       // one read or write in progress
  Duration ws_idle_timeout = std::chrono::seconds(30);  // no frame, no pong: the peer is gone
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> start(EventLoop& loop, ServerOptions options, ServerHandler& handler);
  ~Server();
  int port() const;
  std::size_t connections() const;
  // Stops accepting and closes every connection.
  void stop();

  struct Impl;  // public so the .cpp's session classes can name it

 private:
  explicit Server(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace corral::net
