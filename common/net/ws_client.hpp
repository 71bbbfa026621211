#pragma once
// WsClient: one outgoing WebSocket over TLS with a client certificate (the agent's link
// to the coordinator). Runs on an EventLoop; callbacks come on its thread. One write in
// flight, a bounded queue, pings to notice a dead peer.

#include <functional>
#include <memory>
#include <string>

#include "common/core/time.hpp"
#include "common/net/event_loop.hpp"
#include "common/net/http_client.hpp"

namespace corral::net {

struct WsClientOptions {
  std::string url;                                     // https://host:port
  std::string path = "/v1/agent";
  ClientTls tls;
  Duration connect_timeout = std::chrono::seconds(10);
  // No frame and no pong for this long: the link is dead (a ping goes out at half of it).
  // The coordinator says nothing to an idle agent: each agent's ping costs it a pong, so
  // 2,000 agents at 15 s sent it 267 a second; at 60 s, 67.
  Duration idle_timeout = std::chrono::seconds(60);
  // What this end sent and the peer has not acknowledged for this long ends the link
  // (TCP_USER_TIMEOUT): an agent sends a heartbeat every second, so a coordinator that is
  // gone without a word (its host down, the network cut) is seen within it, no ping needed.
  Duration unacked_timeout = std::chrono::seconds(15);
  std::size_t max_message_bytes = 64 * 1024 * 1024;
  std::size_t max_queue_bytes = 256 * 1024 * 1024;
};

class WsClient {
 public:
  struct Handlers {
    std::function<void()> on_open;
    std::function<void(std::string)> on_message;
    // Called once per connect() that does not end in on_open, or when an open link ends.
    std::function<void(std::string reason)> on_close;
  };

  WsClient(EventLoop& loop, WsClientOptions options, Handlers handlers);
  ~WsClient();
  WsClient(const WsClient&) = delete;
  WsClient& operator=(const WsClient&) = delete;

  void connect();
  bool open() const;
  // Dropped when not open.
  void send(std::string text);
  void close();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace corral::net
