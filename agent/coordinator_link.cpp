#include "agent/coordinator_link.hpp"

#include <spdlog/spdlog.h>

#include <random>

#include "common/net/event_loop.hpp"
#include "common/protocol/codec.hpp"

namespace corral::agent {

namespace {
constexpr Duration kFirstBackoff = std::chrono::milliseconds(100);
}  // namespace

CoordinatorLink::CoordinatorLink(net::EventLoop& loop, net::WsClientOptions options, Duration max_backoff,
                                 Handlers handlers)
    : loop_(loop),
      url_(options.url),
      max_backoff_(max_backoff),
      handlers_(std::move(handlers)),
      backoff_(kFirstBackoff),
      reconnect_timer_(std::make_unique<net::Timer>(loop)),
      heartbeat_timer_(std::make_unique<net::Timer>(loop)) {
  ws_ = std::make_unique<net::WsClient>(loop_, std::move(options),
                                        net::WsClient::Handlers{[this] { on_open(); },
                                                                [this](std::string m) { on_text(std::move(m)); },
                                                                [this](std::string why) { on_close(why); }});
}

CoordinatorLink::~CoordinatorLink() { stop(); }

void CoordinatorLink::start() { connect(); }

void CoordinatorLink::stop() {
  if (stopping_) return;
  stopping_ = true;
  welcomed_ = false;
  heartbeat_timer_->cancel();
  reconnect_timer_->cancel();
  ws_->close();
}

void CoordinatorLink::connect() {
  if (stopping_) return;
  welcomed_ = false;
  ws_->connect();
}

void CoordinatorLink::on_open() {
  backoff_ = kFirstBackoff;
  protocol::Hello hello = handlers_.hello();
  hello.cluster = cluster_;
  ws_->send(protocol::encode(protocol::AgentMessage(hello)));
  spdlog::info("connected to {}; said hello with {} running rank(s)", url_, hello.running.size());
}

void CoordinatorLink::on_text(std::string text) {
  auto decoded = protocol::decode_coordinator_message(text);
  if (!decoded) {
    spdlog::warn("bad message from the coordinator: {}", decoded.error().message());
    return;
  }
  if (const auto* welcome = std::get_if<protocol::Welcome>(&*decoded)) return on_welcome(*welcome);
  // A coordinator of another cluster has job ids of its own: none of its orders is about
  // our jobs (a kill of "job 7" there is not a kill of our job 7).
  if (!foreign_.empty()) return;
  if (const auto* ack = std::get_if<protocol::Ack>(&*decoded)) {
    auto before = outbox_.settled();
    outbox_.acknowledged(ack->received);
    if (outbox_.settled() != before && handlers_.acknowledged) handlers_.acknowledged();
    return;
  }
  handlers_.message(std::move(*decoded));
}

void CoordinatorLink::on_welcome(const protocol::Welcome& m) {
  // Heartbeats run on any welcomed connection, a held one too: the coordinator shows the
  // node as up and held rather than as silent.
  heartbeat_timer_->start_repeating(std::chrono::milliseconds(m.heartbeat_interval_ms), [this] {
    if (ws_->open()) ws_->send(protocol::encode(protocol::AgentMessage(protocol::Heartbeat{})));
  });
  if (cluster_.empty()) cluster_ = m.cluster;  // an older coordinator says none
  if (!m.cluster.empty() && m.cluster != cluster_) {
    if (foreign_ != m.cluster) {
      spdlog::error("the coordinator is cluster {}, but this agent serves cluster {}: holding this node's ranks and "
                    "reports, and obeying none of its orders; restart the agent to join cluster {} (which kills "
                    "the ranks it runs), or start the coordinator on cluster {}'s database",
                    m.cluster, cluster_, m.cluster, cluster_);
    }
    foreign_ = m.cluster;
    return;
  }
  if (!foreign_.empty()) spdlog::info("the coordinator is cluster {} again: carrying on", cluster_);
  foreign_.clear();
  welcomed_ = true;
  spdlog::info("welcomed by the coordinator; heartbeat every {} ms, {} message(s) held back to send",
               m.heartbeat_interval_ms, outbox_.held());
  for (auto& text : outbox_.release()) ws_->send(std::move(text));
  handlers_.welcomed();
}

void CoordinatorLink::on_close(const std::string& reason) {
  welcomed_ = false;
  foreign_.clear();
  // What the coordinator did not acknowledge may not have reached it: sent again, first,
  // on the next connection.
  outbox_.link_lost();
  heartbeat_timer_->cancel();
  if (stopping_) return;
  static thread_local std::mt19937 rng(std::random_device{}());
  auto jitter = std::uniform_int_distribution<long>(0, backoff_.count() / 2)(rng);
  Duration wait = backoff_ + Duration(jitter);
  spdlog::warn("link to the coordinator down ({}); retrying in {} ms", reason,
               std::chrono::duration_cast<std::chrono::milliseconds>(wait).count());
  backoff_ = std::min<Duration>(backoff_ * 2, max_backoff_);
  reconnect_timer_->start(wait, [this] { connect(); });
}

void CoordinatorLink::send(const protocol::AgentMessage& message) {
  std::string text = protocol::encode(message);
  bool report = protocol::is_report(message);
  if (welcomed_ && ws_->open()) {
    if (report) outbox_.sent(text);
    ws_->send(std::move(text));
    return;
  }
  if (report) outbox_.hold(std::move(text));
}

}  // namespace corral::agent
