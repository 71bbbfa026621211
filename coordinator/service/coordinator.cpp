#include "coordinator/service/coordinator.hpp"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/core/strings.hpp"
#include "common/protocol/codec.hpp"
#include "coordinator/service/views.hpp"

namespace corral::service {

Coordinator::Coordinator(net::EventLoop& loop, const Clock& clock, store::Store& store,
                         model::CoordinatorConfig config, std::string cluster)
    : loop_(loop),
      clock_(clock),
      store_(store),
      config_(std::move(config)),
      ledger_(config_),
      committer_(
          loop, store, [this](const Error& e) { fatal(e); },
          [this](const Error* failing) { store_state_changed(failing); }) {
  committer_.on_committed([this] {
    if (rank_write_in_batch_) {
      rank_write_in_batch_ = false;
      rank_write_next_ = std::chrono::steady_clock::now() +
                         2 * std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(committer_.last_commit_seconds()));
    }
    // Held Acks go once nothing they cover waits: the rank records were written with
    // this batch, or a whole record of their job was (which carries its ranks).
    if (acks_held_) send_acks();
    status_changed();
  });
  committer_.on_flush([this] { return collect_rank_records(); });
  ledger_.set_cluster(std::move(cluster));
  node_listing_ = std::make_unique<NodeListing>();
}

Coordinator::~Coordinator() = default;

void Coordinator::fatal(const Error& error) {
  // Memory is ahead of the disk and they can no longer be made to agree: stop, and let
  // the restart reload the truth from SQLite. A failure, so the unit restarts it.
  spdlog::critical("cannot persist a state change: {}; stopping", error.to_string());
  failed_ = true;
  loop_.stop();
}

void Coordinator::store_state_changed(const Error* failing) {
  // Reads go on from memory, writes are refused with 503, agents' reports wait for their
  // Ack (the agents resend what is not acknowledged), and no job is placed: nothing new
  // is promised while nothing can be made durable.
  if (failing != nullptr) {
    spdlog::error("the database cannot be written: {}; refusing writes and holding reports until it can "
                  "(tried again every {} ms)",
                  failing->to_string(), Committer::kRetry.count());
    ++stats_.store_failures;
  } else {
    spdlog::info("the database can be written again: the held changes are committed");
    request_pass();
  }
  status_changed();
}

Result<void> Coordinator::start() {
  auto snapshot = store_.load();
  if (!snapshot) return std::unexpected(snapshot.error());
  if (auto ok = ledger_.restore(std::move(*snapshot), clock_.read(), ended_lookup()); !ok) return ok;
  flush_effects();
  tick_timer_ = std::make_unique<net::Timer>(loop_);
  Duration period = std::max<Duration>(std::chrono::milliseconds(50),
                                       std::min(config_.heartbeat_interval, config_.schedule_interval) / 4);
  tick_timer_->start_repeating(period, [this] { tick(); });
  request_pass();
  return {};
}

ledger::Ledger::EndedLookup Coordinator::ended_lookup() {
  // A primary-key read of SQLite; only for dependencies on jobs the ledger let go of.
  return [this](model::JobId id) -> std::optional<ledger::Ledger::StoredJob> {
    auto rec = store_.job(id);
    if (!rec || !*rec) return std::nullopt;
    return ledger::Ledger::StoredJob{(*rec)->state, (*rec)->array};
  };
}

void Coordinator::shutdown() {
  if (tick_timer_) tick_timer_->cancel();
  if (status_timer_) status_timer_->cancel();
  for (const auto& s : status_streams_) s.stream->close();
  status_streams_.clear();
  if (pass_timer_) pass_timer_->cancel();
  if (rank_write_timer_) rank_write_timer_->cancel();
  rank_write_next_ = {};  // what waits for its paced write is written now
  committer_.flush();
}

void Coordinator::flush_effects() {
  ledger::Effects e = ledger_.take(/*defer_rank_records=*/true);
  if (ledger_.rank_records_due()) committer_.wake();
  // Ended jobs are changes: the commit that stores them tells the page (on_committed).
  status_ended_ += e.ended.size();
  for (auto& change : e.changes) committer_.enqueue(std::move(change));
  if (!e.messages.empty() || !e.ended.empty()) {
    committer_.then([this, messages = std::move(e.messages), ended = std::move(e.ended)] {
      for (const auto& m : messages) send(m.node, m.message);
      for (model::JobId id : ended) answer_job_waits(id);
    });
  }
  for (const auto& [node, why] : e.close) {
    auto it = conns_.find(node);
    if (it != conns_.end()) it->second->close(why);
  }
  if (e.pass_wanted) request_pass();
  if (!e.close.empty()) status_changed();  // an agent's link closed: the grid says so
}

void Coordinator::request_pass() {
  if (pass_posted_) return;
  pass_posted_ = true;
  // Pacing: a pass that took d is followed by at least 2d of other work, so a long queue
  // costs the scheduler at most a third of the loop and submissions keep flowing. A
  // short queue's passes take microseconds and run on the next turn.
  auto since = std::chrono::steady_clock::now() - last_pass_end_;
  auto gap = 2 * last_pass_took_;
  if (since < gap) {
    if (!pass_timer_) pass_timer_ = std::make_unique<net::Timer>(loop_);
    pass_timer_->start(std::chrono::duration_cast<Duration>(gap - since), [this] {
      pass_posted_ = false;
      run_pass();
    });
    return;
  }
  loop_.post([this] {
    pass_posted_ = false;
    run_pass();
  });
}

void Coordinator::run_pass() {
  if (ledger_.in_grace()) return;  // placements wait until we know what still runs
  if (committer_.failing()) return;  // store_state_changed asks for a pass when it can write
  auto t0 = std::chrono::steady_clock::now();
  ledger_.schedule(clock_.read());
  last_pass_end_ = std::chrono::steady_clock::now();
  last_pass_took_ = last_pass_end_ - t0;
  stats_.last_pass_ms = std::chrono::duration<double, std::milli>(last_pass_took_).count();
  ++stats_.passes;
  flush_effects();
}

void Coordinator::tick() {
  const Now now = clock_.read();
  ledger_.tick(now);
  flush_effects();
  // What a burst of jobs used and freed goes back to the system, not kept by malloc for
  // a next burst that may not come: every 30 s. (CPU work on the loop, no wait; its cost
  // grows with the heap and is not measured yet.)
  if (now.mono - last_trim_ >= std::chrono::seconds(30)) {
    last_trim_ = now.mono;
    ::malloc_trim(0);
  }
  // Job waits whose time is up see the job as it is now.
  for (auto it = job_waits_.begin(); it != job_waits_.end();) {
    if (now.mono >= it->second.deadline) {
      it->second.respond(show_job(it->first));
      it = job_waits_.erase(it);
    } else {
      ++it;
    }
  }
  // Log requests the agent never answered.
  for (auto it = log_waits_.begin(); it != log_waits_.end();) {
    if (now.mono > it->second.deadline) {
      it->second.respond({504, "application/json", R"({"error":"the agent did not answer in time"})", {}});
      it = log_waits_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = stack_waits_.begin(); it != stack_waits_.end();) {
    if (now.mono > it->second.deadline) {
      answer_stack(std::move(it->second));
      it = stack_waits_.erase(it);
    } else {
      ++it;
    }
  }
  if (now.mono - last_status_ping_ >= kStatusPing) {
    last_status_ping_ = now.mono;
    broadcast_status(": ping\n\n");
  }
  // A private page's live feed ends with the token that opened it (replaced by add-user).
  if (now.mono - last_stream_token_check_ >= kTokenRecheck) {
    last_stream_token_check_ = now.mono;
    close_streams_of_gone_tokens();
  }
  if (!committer_.failing()) {
    if (auto prune = submit_keys_.prune_due(now.wall)) committer_.enqueue(std::move(*prune));
  }
  if (now.mono - last_periodic_pass_ >= config_.schedule_interval) {
    last_periodic_pass_ = now.mono;
    request_pass();  // time limits and fair share move with the clock
  }
}

// ---------------------------------------------------------------- agents

Result<void> Coordinator::accept_ws(const net::HttpRequest& request) {
  // The node name comes from the certificate the cluster CA signed, never from a message.
  if (request.peer_cn.empty()) {
    return make_error(ErrorCode::Unauthenticated, "agents must present a client certificate signed by the cluster CA");
  }
  return {};
}

void Coordinator::on_ws_open(const std::shared_ptr<net::WsConnection>& conn) {
  spdlog::info("agent {} connected from {}", conn->peer_cn(), conn->remote());
}

void Coordinator::on_ws_close(const std::shared_ptr<net::WsConnection>& conn) {
  auto it = conns_.find(conn->peer_cn());
  if (it == conns_.end() || it->second != conn) return;
  conns_.erase(it);
  spdlog::info("agent {} disconnected", conn->peer_cn());
  ledger_.agent_disconnected(conn->peer_cn());
  flush_effects();
}

void Coordinator::send(const std::string& node, const protocol::CoordinatorMessage& message) {
  auto it = conns_.find(node);
  if (it == conns_.end()) {
    spdlog::debug("not sending {} to {}: not connected", protocol::type_name(message), node);
    return;
  }
  it->second->send(protocol::encode(message));
}

void Coordinator::on_ws_message(const std::shared_ptr<net::WsConnection>& conn, std::string text) {
  ++stats_.agent_messages;
  const std::string& node = conn->peer_cn();
  if (protocol::is_encoded_heartbeat(text)) {
    // 2,000 nodes send 2,000 a second: no JSON, and nothing changes that needs flushing.
    auto it = conns_.find(node);
    if (it != conns_.end() && it->second == conn) {
      ledger_.agent_message(node, protocol::Heartbeat{}, clock_.read());
    } else {
      spdlog::warn("agent {} sent heartbeat before hello", node);
    }
    return;
  }
  auto decoded = protocol::decode_agent_message(text);
  if (!decoded) {
    ++stats_.bad_agent_messages;
    spdlog::warn("bad message from agent {}: {}", node, decoded.error().message());
    // Nothing changes and the link stays up; the agent counted it as a report, so does
    // the acknowledgement (else every later Ack would fall one short).
    if (auto it = conns_.find(node); it != conns_.end() && it->second == conn && protocol::counts_as_report(text)) {
      ++received_[node];
    }
    return;
  }
  if (auto* hello = std::get_if<protocol::Hello>(&*decoded)) {
    if (hello->node != node) {
      spdlog::warn("agent with certificate {} says it is {}: refused", node, hello->node);
      conn->close("node name does not match the certificate");
      return;
    }
    if (hello->version != protocol::kProtocolVersion) {
      conn->close("protocol version " + std::to_string(hello->version) + " is not supported");
      return;
    }
    auto& current = conns_[node];
    if (current == conn) {
      // One hello per connection: a second would reset what the first set up.
      ++stats_.bad_agent_messages;
      spdlog::warn("agent {} said hello twice on one connection: ignored", node);
      return;
    }
    if (current) current->close("replaced by a new connection");
    current = conn;
    received_[node] = 0;
    if (auto ok = ledger_.agent_hello(node, std::move(*hello), clock_.read()); !ok) {
      conn->close(ok.error().message());
      conns_.erase(node);
    }
    flush_effects();
    return;
  }
  auto it = conns_.find(node);
  if (it == conns_.end() || it->second != conn) {
    spdlog::warn("agent {} sent {} before hello", node, protocol::type_name(*decoded));
    return;
  }
  if (auto* log = std::get_if<protocol::LogData>(&*decoded)) return on_log_data(node, *log);
  if (auto* stacks = std::get_if<protocol::Stacks>(&*decoded)) return on_stacks(node, *stacks);
  ledger_.agent_message(node, *decoded, clock_.read());
  flush_effects();
  if (protocol::is_report(*decoded) && !ledger_.holds_foreign(node)) {
    ++received_[node];
    acknowledge(node);
  }
}

void Coordinator::acknowledge(const std::string& node) {
  if (std::find(ack_due_.begin(), ack_due_.end(), node) != ack_due_.end()) return;
  ack_due_.push_back(node);
  if (ack_due_.size() > 1) return;  // a callback is queued already, or the Acks are held
  // After the commit of everything those reports changed (and of whatever was queued
  // with them: the count is read then).
  committer_.then([this] { send_acks(); });
}

void Coordinator::send_acks() {
  if (ledger_.rank_records_due()) {
    acks_held_ = true;  // sent when the rank records are committed (on_committed)
    return;
  }
  acks_held_ = false;
  for (const auto& n : ack_due_) send(n, protocol::Ack{received_[n]});
  ack_due_.clear();
}

std::vector<store::Change> Coordinator::collect_rank_records() {
  if (!ledger_.rank_records_due()) return {};
  const auto now = std::chrono::steady_clock::now();
  if (now < rank_write_next_) {
    if (!rank_write_armed_) {
      rank_write_armed_ = true;
      if (!rank_write_timer_) rank_write_timer_ = std::make_unique<net::Timer>(loop_);
      rank_write_timer_->start(std::chrono::duration_cast<Duration>(rank_write_next_ - now), [this] {
        rank_write_armed_ = false;
        committer_.wake();
      });
    }
    return {};
  }
  auto records = ledger_.take_rank_records();
  rank_write_in_batch_ = !records.empty();
  return records;
}

void Coordinator::on_log_data(const std::string& node, const protocol::LogData& m) {
  auto it = log_waits_.find(m.request);
  if (it == log_waits_.end() || it->second.node != node) return;
  net::HttpResponse res;
  if (!m.error.empty()) {
    res = {404, "application/json", nlohmann::json{{"error", m.error}}.dump(), {}};
  } else {
    res.body = nlohmann::json{{"rank", it->second.rank},   {"node", node},         {"offset", m.offset},
                              {"data", m.data},            {"size", m.size},       {"finished", m.finished},
                              {"cut", m.cut},              {"lost", m.lost}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  it->second.respond(std::move(res));
  log_waits_.erase(it);
}

void Coordinator::on_stacks(const std::string& node, const protocol::Stacks& m) {
  auto it = stack_waits_.find(m.request);
  if (it == stack_waits_.end() || it->second.asked.erase(node) == 0) return;
  auto& wait = it->second;
  for (const auto& r : m.ranks) {
    auto report = wait.reports.find(r.rank);
    if (report != wait.reports.end() && report->second.first == node) report->second.second = r.report;
  }
  if (!wait.asked.empty()) return;
  answer_stack(std::move(wait));
  stack_waits_.erase(it);
}

}  // namespace corral::service
