#pragma once
// CoordinatorLink: the agent's one WebSocket to the coordinator. It dials (the agent may
// be behind NAT), says Hello, and once welcomed sends a heartbeat every interval the
// coordinator asked for. Reports (protocol::is_report) are kept in an Outbox until the
// coordinator acknowledges them, so a report sent on a link that then drops, or made
// while no link was up, is sent first on the next one. A lost link is dialled again with
// an exponential backoff and jitter, so a restarted coordinator is not hit by every agent
// at once. Welcome and Ack are handled here; every other message goes to the agent. A
// coordinator whose welcome names another cluster than the first one's is held at arm's
// length: heartbeats only, until the link's own cluster welcomes it again.
// Lives on the agent's loop; nothing here waits.

#include <functional>
#include <memory>
#include <string>

#include "agent/outbox.hpp"
#include "common/core/time.hpp"
#include "common/net/ws_client.hpp"
#include "common/protocol/messages.hpp"

namespace corral::net {
class EventLoop;
class Timer;
}  // namespace corral::net

namespace corral::agent {

class CoordinatorLink {
 public:
  struct Handlers {
    // The Hello to say on each new connection (it lists the ranks running now).
    std::function<protocol::Hello()> hello;
    // Welcomed: what was held back is on its way and heartbeats run.
    std::function<void()> welcomed;
    // Every message but Welcome and Ack.
    std::function<void(protocol::CoordinatorMessage)> message;
    // Reports were acknowledged: settled() went up. May be empty.
    std::function<void()> acknowledged = {};
  };
  CoordinatorLink(net::EventLoop& loop, net::WsClientOptions options, Duration max_backoff, Handlers handlers);
  ~CoordinatorLink();
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  // Connects, and reconnects with backoff whenever the link drops; nothing once stopped.
  void start();
  // Closes the link for good: no reconnect, no heartbeat.
  void stop();
  // A report is kept until acknowledged; anything else is sent only on a welcomed link
  // (heartbeats, log data and Synced matter on this connection alone).
  void send(const protocol::AgentMessage& message);

  // Welcomed by a coordinator of this agent's cluster (not one that is held).
  bool welcomed() const { return welcomed_; }
  // The cluster whose coordinator first welcomed this process ("" before that, or when
  // it was an older coordinator that names none).
  const std::string& cluster() const { return cluster_; }
  // The identity of the coordinator of another cluster this link is connected to, if so:
  // it gets heartbeats only, its orders are dropped, and reports wait.
  const std::string& held_by() const { return foreign_; }
  std::size_t unacknowledged() const { return outbox_.held() + outbox_.unacknowledged(); }
  // The number of the last report sent, and how many of the first reports the coordinator
  // has acknowledged (or that were dropped over the outbox's bound): report n needs
  // nothing more from its maker once settled() >= n.
  std::uint64_t reports_made() const { return outbox_.made(); }
  std::uint64_t settled() const { return outbox_.settled(); }

 private:
  void connect();
  void on_open();
  void on_text(std::string text);
  void on_close(const std::string& reason);
  void on_welcome(const protocol::Welcome& m);

  net::EventLoop& loop_;
  std::string url_;
  Duration max_backoff_;
  Handlers handlers_;
  Outbox outbox_;
  bool welcomed_ = false;
  bool stopping_ = false;
  std::string cluster_;
  std::string foreign_;
  Duration backoff_;
  std::unique_ptr<net::Timer> reconnect_timer_;
  std::unique_ptr<net::Timer> heartbeat_timer_;
  std::unique_ptr<net::WsClient> ws_;  // last: destroyed first, so no callback comes late
};

}  // namespace corral::agent
