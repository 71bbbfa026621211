// The agent's link alone, against a real TLS WebSocket server on 127.0.0.1 playing the
// coordinator: hello, welcome, heartbeats, reports held while no link is up, reports not
// acknowledged sent again first on the next link, and messages handed to the agent.

#include "agent/coordinator_link.hpp"

#include <gtest/gtest.h>

#include "common/net/event_loop.hpp"
#include "common/net/pki.hpp"
#include "common/net/server.hpp"
#include "common/protocol/codec.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::agent {
namespace {

using namespace std::chrono_literals;

// What the link sent, decoded, per connection; the test says what to answer.
class FakeCoordinator : public net::ServerHandler {
 public:
  void on_http(const net::HttpRequest&, std::function<void(net::HttpResponse)> respond) override {
    respond({404, "text/plain", "", {}});
  }
  Result<void> accept_ws(const net::HttpRequest&) override { return {}; }
  void on_ws_open(const std::shared_ptr<net::WsConnection>& c) override {
    conn = c;
    connections.emplace_back();
    changed();
  }
  void on_ws_message(const std::shared_ptr<net::WsConnection>& c, std::string text) override {
    auto m = protocol::decode_agent_message(text);
    ASSERT_TRUE(m.has_value()) << text;
    connections.back().push_back(*m);
    if (std::holds_alternative<protocol::Hello>(*m) && welcome) {
      c->send(protocol::encode(protocol::CoordinatorMessage(protocol::Welcome{protocol::kProtocolVersion, 50, 1000, ""})));
    }
    changed();
  }
  void on_ws_close(const std::shared_ptr<net::WsConnection>&) override {
    ++closed;
    changed();
  }
  void changed() {
    if (on_change) on_change();
  }
  // The reports (is_report) received on connection `i`, as RankExited ranks.
  std::vector<int> exited_ranks(std::size_t i) const {
    std::vector<int> out;
    for (const auto& m : connections.at(i)) {
      if (const auto* e = std::get_if<protocol::RankExited>(&m)) out.push_back(e->rank);
    }
    return out;
  }
  int heartbeats(std::size_t i) const {
    int n = 0;
    for (const auto& m : connections.at(i)) n += std::holds_alternative<protocol::Heartbeat>(m);
    return n;
  }

  bool welcome = true;
  std::shared_ptr<net::WsConnection> conn;
  std::vector<std::vector<protocol::AgentMessage>> connections;
  int closed = 0;
  std::function<void()> on_change;
};

protocol::RankExited exited(int rank) { return {7, 1, rank, 0, 0, "exited with code 0", false}; }

class CoordinatorLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(net::create_ca(dir_.file("ca.pem"), dir_.file("ca.key"), "corral test CA").has_value());
    ASSERT_TRUE(net::issue_certificate(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("server.pem"),
                                       dir_.file("server.key"), {"coordinator", {"127.0.0.1"}, true, false})
                    .has_value());
    ASSERT_TRUE(net::issue_certificate(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("agent.pem"),
                                       dir_.file("agent.key"), {"gpu-a", {}, false, true})
                    .has_value());
    net::ServerOptions opts;
    opts.host = "127.0.0.1";
    opts.tls = {dir_.file("ca.pem"), dir_.file("server.pem"), dir_.file("server.key")};
    auto server = net::Server::start(loop_, opts, coordinator_);
    ASSERT_TRUE(server.has_value()) << server.error().message();
    server_ = std::move(*server);
    net::WsClientOptions ws;
    ws.url = "https://127.0.0.1:" + std::to_string(server_->port());
    ws.tls = {dir_.file("ca.pem"), dir_.file("agent.pem"), dir_.file("agent.key")};
    link_ = std::make_unique<CoordinatorLink>(
        loop_, ws, 200ms,
        CoordinatorLink::Handlers{[] {
                                    protocol::Hello h;
                                    h.node = "gpu-a";
                                    h.address = "127.0.0.1";
                                    return h;
                                  },
                                  [this] {
                                    ++welcomed_;
                                    coordinator_.changed();
                                  },
                                  [this](protocol::CoordinatorMessage m) {
                                    received_.push_back(std::move(m));
                                    coordinator_.changed();
                                  }});
  }
  void TearDown() override {
    link_.reset();
    if (server_) server_->stop();
    loop_.poll();
  }

  // Runs the one loop (server and link both) until `pred` holds after an event, or fails
  // after `timeout`.
  bool run_until(std::function<bool()> pred, std::chrono::milliseconds timeout = 10s) {
    if (pred()) return true;
    bool held = false;
    coordinator_.on_change = [&] {
      if (!held && pred()) {
        held = true;
        loop_.stop();
      }
    };
    net::Timer deadline(loop_);
    deadline.start(timeout, [this] { loop_.stop(); });
    loop_.run();
    coordinator_.on_change = nullptr;
    return held;
  }

  testing::TempDir dir_;
  net::EventLoop loop_;
  FakeCoordinator coordinator_;
  std::unique_ptr<net::Server> server_;
  std::unique_ptr<CoordinatorLink> link_;
  int welcomed_ = 0;
  std::vector<protocol::CoordinatorMessage> received_;
};

TEST_F(CoordinatorLinkTest, ReportsMadeBeforeTheLinkIsUpGoFirstInOrderThenHeartbeats) {
  link_->send(exited(0));
  link_->send(exited(1));
  link_->send(protocol::Heartbeat{});  // not a report: dropped while no link is up
  EXPECT_EQ(link_->unacknowledged(), 2u);
  link_->start();
  ASSERT_TRUE(run_until([&] { return !coordinator_.connections.empty() && coordinator_.heartbeats(0) >= 3; }));
  EXPECT_EQ(welcomed_, 1);
  EXPECT_TRUE(link_->welcomed());
  const auto& first = coordinator_.connections[0];
  ASSERT_GE(first.size(), 3u);
  EXPECT_TRUE(std::holds_alternative<protocol::Hello>(first[0]));
  EXPECT_EQ(coordinator_.exited_ranks(0), (std::vector<int>{0, 1}));
  EXPECT_TRUE(std::holds_alternative<protocol::RankExited>(first[1])) << "held reports come before any heartbeat";
  EXPECT_TRUE(std::holds_alternative<protocol::RankExited>(first[2]));
}

TEST_F(CoordinatorLinkTest, WhatWasNotAcknowledgedIsSentFirstOnTheNextLinkAndWhatWasIsNot) {
  link_->start();
  ASSERT_TRUE(run_until([&] { return welcomed_ == 1; }));
  link_->send(exited(0));
  link_->send(exited(1));
  link_->send(exited(2));
  ASSERT_TRUE(run_until([&] { return coordinator_.exited_ranks(0).size() == 3; }));
  // The coordinator committed the first two of this connection, then the link drops.
  coordinator_.conn->send(protocol::encode(protocol::CoordinatorMessage(protocol::Ack{2})));
  coordinator_.conn->close("test");
  // Made while the link is down: held, after the unacknowledged one.
  ASSERT_TRUE(run_until([&] { return coordinator_.closed == 1 && !link_->welcomed(); }));
  link_->send(exited(3));
  ASSERT_TRUE(run_until([&] { return welcomed_ == 2 && coordinator_.exited_ranks(1).size() == 2; }));
  EXPECT_EQ(coordinator_.exited_ranks(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(link_->unacknowledged(), 2u);
  coordinator_.conn->send(protocol::encode(protocol::CoordinatorMessage(protocol::Ack{2})));
  // Messages are read in order: once the Kill after it is through, so is the Ack.
  coordinator_.conn->send(protocol::encode(protocol::CoordinatorMessage(protocol::Kill{7, 1, 0})));
  ASSERT_TRUE(run_until([&] { return received_.size() == 1; }));
  EXPECT_EQ(link_->unacknowledged(), 0u);
}

TEST_F(CoordinatorLinkTest, OtherMessagesReachTheAgentAndOneThatDoesNotDecodeChangesNothing) {
  link_->start();
  ASSERT_TRUE(run_until([&] { return welcomed_ == 1; }));
  coordinator_.conn->send("{\"type\":\"kill\",\"job\":\"seven\"}");
  coordinator_.conn->send(protocol::encode(protocol::CoordinatorMessage(protocol::Kill{7, 1, 500})));
  ASSERT_TRUE(run_until([&] { return !received_.empty(); }));
  ASSERT_EQ(received_.size(), 1u);
  const auto* kill = std::get_if<protocol::Kill>(&received_[0]);
  ASSERT_NE(kill, nullptr);
  EXPECT_EQ(kill->job, 7);
  EXPECT_EQ(kill->grace_ms, 500);
  EXPECT_EQ(coordinator_.closed, 0) << "the link stays up";
  EXPECT_EQ(welcomed_, 1);
}

TEST_F(CoordinatorLinkTest, ALinkNeverWelcomedSendsNoReportAndStoppedItDialsNoMore) {
  coordinator_.welcome = false;
  link_->start();
  ASSERT_TRUE(run_until([&] { return coordinator_.connections.size() == 1 && !coordinator_.connections[0].empty(); }));
  link_->send(exited(4));
  link_->send(protocol::Heartbeat{});
  // The server drops it; the link dials again after its backoff and says hello again.
  coordinator_.conn->close("test");
  ASSERT_TRUE(run_until([&] { return coordinator_.connections.size() == 2 && !coordinator_.connections[1].empty(); }));
  for (const auto& c : coordinator_.connections) {
    ASSERT_EQ(c.size(), 1u) << "only the hello, never a report or a heartbeat on a link not welcomed";
    EXPECT_TRUE(std::holds_alternative<protocol::Hello>(c[0]));
  }
  EXPECT_EQ(link_->unacknowledged(), 1u);
  link_->stop();
  ASSERT_TRUE(run_until([&] { return coordinator_.closed == 2; }));
  // No third connection within several backoffs (the longest is 200 ms here).
  EXPECT_FALSE(run_until([&] { return coordinator_.connections.size() == 3; }, 1s));
}

}  // namespace
}  // namespace corral::agent
