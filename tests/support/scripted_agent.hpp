#pragma once
// A test agent that speaks the real protocol over the real WebSocket with a real client
// certificate, driven step by step by the test: send a message, wait for the next one.
// Its event loop runs on its own thread, so several agents in one test all keep
// heartbeating and reading while the test waits on one of them.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/net/event_loop.hpp"
#include "common/net/ws_client.hpp"
#include "common/protocol/codec.hpp"

namespace corral::testing {

class ScriptedAgent {
 public:
  ScriptedAgent(std::string url, std::string cert_dir, protocol::Hello hello) : hello_(std::move(hello)) {
    opts_.url = std::move(url);
    opts_.tls = {cert_dir + "/ca.pem", cert_dir + "/" + hello_.node + ".pem", cert_dir + "/" + hello_.node + ".key"};
    opts_.idle_timeout = std::chrono::seconds(5);
    thread_ = std::thread([this] { loop_.run(); });
  }

  ~ScriptedAgent() {
    loop_.post([this] {
      heartbeat_.reset();
      ws_.reset();
      loop_.stop();
    });
    thread_.join();
  }

  ScriptedAgent(const ScriptedAgent&) = delete;
  ScriptedAgent& operator=(const ScriptedAgent&) = delete;

  // Connects and says hello; true once the coordinator answered with Welcome.
  bool connect(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    {
      std::lock_guard lock(mu_);
      closed_.reset();
      inbox_.clear();
    }
    loop_.post([this] {
      ws_ = std::make_unique<net::WsClient>(
          loop_, opts_,
          net::WsClient::Handlers{[this] { ws_->send(protocol::encode(protocol::AgentMessage(hello_))); },
                                  [this](std::string m) {
                                    auto d = protocol::decode_coordinator_message(m);
                                    if (!d) return;
                                    std::lock_guard lock(mu_);
                                    inbox_.push_back(std::move(*d));
                                    cv_.notify_all();
                                  },
                                  [this](std::string why) {
                                    std::lock_guard lock(mu_);
                                    closed_ = why;
                                    cv_.notify_all();
                                  }});
      ws_->connect();
      heartbeat_ = std::make_unique<net::Timer>(loop_);
      heartbeat_->start_repeating(std::chrono::milliseconds(100), [this] {
        if (heartbeats && ws_ && ws_->open()) ws_->send(protocol::encode(protocol::AgentMessage(protocol::Heartbeat{})));
      });
    });
    auto welcome = expect<protocol::Welcome>(timeout);
    if (!welcome.has_value()) return false;
    welcome_ = *welcome;
    // As a real agent does once its held-back reports are sent; tests that play those
    // reports first turn this off and send Synced themselves.
    if (sync_on_welcome) send(protocol::Synced{});
    return true;
  }

  void send(const protocol::AgentMessage& m) {
    if (protocol::is_report(m)) ++reports_sent_;
    loop_.post([this, text = protocol::encode(m)]() mutable {
      if (ws_) ws_->send(std::move(text));
    });
  }

  void disconnect() {
    loop_.post([this] {
      if (ws_) ws_->close();
    });
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return closed_.has_value(); });
  }

  // The next message of type T; messages of other types that arrive first are kept.
  template <typename T>
  std::optional<T> expect(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mu_);
    std::optional<T> out;
    cv_.wait_for(lock, timeout, [&] {
      for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
        if (auto* m = std::get_if<T>(&*it)) {
          out = *m;
          inbox_.erase(it);
          return true;
        }
      }
      return closed_.has_value();
    });
    return out;
  }

  // Waits until the coordinator acknowledged every report sent on this connection (it
  // acknowledges once what a report changed is committed).
  bool all_acked(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      auto ack = expect<protocol::Ack>(left);
      if (!ack) return false;
      if (ack->received >= reports_sent_) return true;
    }
  }

  std::optional<std::string> closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }

  // The coordinator's answer to the last connect()'s hello.
  const protocol::Welcome& welcome() const { return welcome_; }

  std::atomic<bool> heartbeats = true;
  std::uint64_t reports_sent_ = 0;
  bool sync_on_welcome = true;
  protocol::Welcome welcome_;

 private:
  net::EventLoop loop_;
  net::WsClientOptions opts_;
  protocol::Hello hello_;
  std::unique_ptr<net::WsClient> ws_;
  std::unique_ptr<net::Timer> heartbeat_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<protocol::CoordinatorMessage> inbox_;
  std::optional<std::string> closed_;
  std::thread thread_;
};

}  // namespace corral::testing
