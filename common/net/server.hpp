#pragma once
// Server: one TLS listener speaking HTTP/1.1 and, on one path, WebSocket; optionally a
// local Unix socket speaking the same HTTP without TLS. Beast's
// advanced-server shape: a listener, one session per connection, a deadline on every
// handshake, read and write, one write in flight with a bounded queue. Everything runs
// on the EventLoop's thread; handlers are called there and must not block for long.

#include <cstdint>
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
  // Also listen here, a Unix socket, for clients on this machine: plain HTTP (no
  // WebSocket), mode 0666, each request still needing its token. Empty: TCP only.
  std::string local_socket;
  std::size_t max_header_bytes = 16 * 1024;
  std::size_t max_body_bytes = 1024 * 1024;
  std::size_t max_ws_message_bytes = 4 * 1024 * 1024;
  std::size_t max_ws_queue_bytes = 64 * 1024 * 1024;
  // HTTP connections at once, and from one client address. When a newcomer finds no
  // room, the connection that has waited longest for someone (in its TLS handshake, for
  // a request's headers and body, or idle between requests) is closed for it; a
  // connection whose request is being answered is never closed so. Only when none waits
  // is the newcomer refused. Agents' WebSockets (a verified certificate) are counted
  // apart, so clients cannot use up their room.
  std::size_t max_connections = 512;
  std::size_t max_connections_per_address = 64;
  std::size_t max_agent_connections = 4096;
  // Streamed answers (a status page's server-sent events) at once, counted apart from
  // HTTP connections like agents; a newcomer past it gets 503. Each queues at most
  // max_stream_queue_bytes; one client address holds at most max_streams_per_address.
  std::size_t max_streams = 256;
  std::size_t max_streams_per_address = 8;
  std::size_t max_stream_queue_bytes = 1024 * 1024;
  Duration handshake_timeout = std::chrono::seconds(3);
  Duration header_timeout = std::chrono::seconds(5);    // a new connection's first request
  Duration idle_timeout = std::chrono::seconds(15);     // HTTP keep-alive between requests
  Duration io_timeout = std::chrono::seconds(30);       // a request's body; a write in progress
  Duration ws_idle_timeout = std::chrono::seconds(30);  // no frame, no pong: the peer is gone
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> start(EventLoop& loop, ServerOptions options, ServerHandler& handler);
  ~Server();
  int port() const;
  std::size_t connections() const;
  // Connections closed to make room for a newcomer, and newcomers refused, so far.
  std::uint64_t evicted() const;
  std::uint64_t refused() const;
  // Stops accepting and closes every connection.
  void stop();

  struct Impl;  // public so the .cpp's session classes can name it

 private:
  explicit Server(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace corral::net
