// The coordinator's side of the agent protocol.

#include <spdlog/spdlog.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/protocol/codec.hpp"
#include "coordinator/service/coordinator.hpp"
#include "coordinator/store/store_rules.hpp"

namespace corral::service {

using model::JobState;

namespace {
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
}  // namespace

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
  auto it = links_.find(conn->peer_cn());
  if (it == links_.end() || it->second.conn != conn) return;
  it->second.connected = false;
  it->second.synced = false;
  it->second.conn.reset();
  spdlog::info("agent {} disconnected", conn->peer_cn());
  // The node is not down yet: it has node_timeout from its last heartbeat to come back.
  // Its jobs stay, but no new job goes there (pending reason NodeDown) until it does.
  (void)scheduler_.set_reachable(conn->peer_cn(), false);
}

void Coordinator::send(const std::string& node, const protocol::CoordinatorMessage& message) {
  auto it = links_.find(node);
  if (it == links_.end() || !it->second.connected || !it->second.conn) {
    spdlog::debug("not sending {} to {}: not connected", protocol::type_name(message), node);
    return;
  }
  it->second.conn->send(protocol::encode(message));
}

void Coordinator::on_ws_message(const std::shared_ptr<net::WsConnection>& conn, std::string text) {
  ++stats_.agent_messages;
  const std::string& node = conn->peer_cn();
  auto decoded = protocol::decode_agent_message(text);
  if (!decoded) {
    ++stats_.bad_agent_messages;
    spdlog::warn("bad message from agent {}: {}", node, decoded.error().message());
    return;  // nothing changes; the link stays up
  }
  auto it = links_.find(node);
  bool said_hello = it != links_.end() && it->second.conn == conn;
  if (!said_hello && !std::holds_alternative<protocol::Hello>(*decoded)) {
    spdlog::warn("agent {} sent {} before hello", node, protocol::type_name(*decoded));
    return;
  }
  if (said_hello) it->second.last_seen = clock_.now();
  std::visit(Overloaded{
                 [&](protocol::Hello& m) { on_hello(conn, std::move(m)); },
                 [&](protocol::Heartbeat&) {},
                 [&](protocol::Health& m) { on_health(node, m); },
                 [&](protocol::PrepareResult& m) { on_prepare_result(node, m); },
                 [&](protocol::RankStarted& m) { on_rank_started(node, m); },
                 [&](protocol::RankExited& m) { on_rank_exited(node, m); },
                 [&](protocol::LogData& m) { on_log_data(node, m); },
                 [&](protocol::Synced&) { on_synced(node); },
                 [&](protocol::AttemptGone& m) { on_attempt_gone(node, m); },
             },
             *decoded);
}

void Coordinator::node_changed(const model::Node& node, const std::vector<sched::Decision>& decisions) {
  committer_.enqueue({{store::UpsertNode{node}}});
  apply(decisions);
  request_pass();
}

// The node's agent is gone: the node is down and its jobs are lost. An admin's drain
// outlives that (maintenance often means stopping the agent or rebooting the node): the
// node stays drained with the admin's reason, its agent not connected, until resumed.
void Coordinator::node_lost(const std::string& name, const std::string& reason, TimePoint now) {
  const model::Node* node = scheduler_.node(name);
  if (node == nullptr) return;
  links_[name].lost = true;
  spdlog::warn("node {} is lost: {}", name, reason);
  bool admin_drained = node->state == model::NodeState::Drained && node->reason.rfind("preflight: ", 0) != 0;
  std::string drain_reason = node->reason;
  auto r = scheduler_.set_node_state(name, model::NodeState::Down, reason, now);
  if (!r) return;
  if (admin_drained) {
    auto kept = scheduler_.set_node_state(name, model::NodeState::Drained, drain_reason, now);
    if (kept) r->insert(r->end(), kept->begin(), kept->end());
  }
  node_changed(*scheduler_.node(name), *r);
  // Jobs that were ending already: their ranks there will not be confirmed soon.
  std::vector<model::JobId> ending;
  for (const auto& [id, job] : jobs_) {
    if (job.record.state == JobState::Ending) ending.push_back(id);
  }
  for (model::JobId id : ending) {
    if (Job* job = live_job(id)) settle_ending(*job);
  }
}

void Coordinator::on_hello(const std::shared_ptr<net::WsConnection>& conn, protocol::Hello hello) {
  const std::string& name = conn->peer_cn();
  if (hello.node != name) {
    spdlog::warn("agent with certificate {} says it is {}: refused", name, hello.node);
    conn->close("node name does not match the certificate");
    return;
  }
  if (hello.version != protocol::kProtocolVersion) {
    conn->close("protocol version " + std::to_string(hello.version) + " is not supported");
    return;
  }
  TimePoint now = clock_.now();
  Link& link = links_[name];
  if (link.conn && link.conn != conn) link.conn->close("replaced by a new connection");
  link.conn = conn;
  link.connected = true;
  link.last_seen = now;
  link.driver = hello.driver;
  link.cuda = hello.cuda;
  link.reported = hello.running;
  link.lost = false;
  link.synced = false;
  ++link.generation;

  model::Node node;
  node.name = name;
  node.address = hello.address;
  node.ports = hello.ports;
  node.simulated = hello.simulated;
  node.gpus = std::move(hello.gpus);
  node.state = model::NodeState::Up;
  const model::Node* known = scheduler_.node(name);
  bool admin_drained = known && known->state == model::NodeState::Drained && known->reason.rfind("preflight: ", 0) != 0;
  if (admin_drained) {
    node.state = model::NodeState::Drained;
    node.reason = known->reason;
  } else if (!hello.health_error.empty()) {
    node.state = model::NodeState::Drained;
    node.reason = "preflight: " + hello.health_error;
  }
  auto decisions = scheduler_.update_node(node, now);
  if (!decisions) {
    conn->close(decisions.error().message());
    link.connected = false;
    link.conn.reset();
    return;
  }
  (void)scheduler_.set_reachable(name, true);
  spdlog::info("agent {} joined: {} GPU(s), address {}{}", name, node.gpus.size(), node.address,
               node.simulated ? ", simulated" : "");
  send(name, protocol::Welcome{protocol::kProtocolVersion, config_.heartbeat_interval.count(),
                               config_.kill_grace.count()});
  node_changed(*scheduler_.node(name), *decisions);
  // Its ranks are judged once it has Synced: the reports it held back come first.
}

// Every report the agent held back has been applied: what it neither runs (its Hello)
// nor reported is not running there. Such a rank is lost, and only then; a restart of
// ours alone never fails or requeues a job.
void Coordinator::on_synced(const std::string& node) {
  Link& link = links_[node];
  link.synced = true;
  std::vector<model::JobId> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (model::JobId id : ids) {
    Job* job = live_job(id);
    if (job == nullptr) continue;
    auto& rec = job->record;
    if (rec.state != JobState::Starting && rec.state != JobState::Running) continue;
    auto sent = job->launched_on.find(node);
    for (const auto& r : rec.ranks) {
      if (r.node != node || model::rank_ended(r.state)) continue;
      // A rank not started yet is only missing if its Launch went out on an earlier
      // connection (or before our restart); one not sent yet, or sent on this
      // connection, will be reported.
      if (r.state == model::RankState::Pending &&
          (sent == job->launched_on.end() || sent->second >= link.generation)) {
        continue;
      }
      bool runs = std::any_of(link.reported.begin(), link.reported.end(), [&](const auto& rr) {
        return rr.job == id && rr.attempt == rec.attempt && rr.rank == r.rank;
      });
      if (runs) continue;
      sched::EventInfo info;
      info.rank = r.rank;
      info.node = node;
      info.message = "rank " + std::to_string(r.rank) + " is not running on " + node + ": its agent does not know it";
      spdlog::warn("job {}: {}", id, info.message);
      for (auto& rr : rec.ranks) {
        if (rr.node == node && !model::rank_ended(rr.state)) rr.state = model::RankState::Lost;
      }
      persist_job(*job, "");
      job_event(id, rec.attempt, sched::JobEvent::NodeLost, info);
      break;
    }
  }
  kill_unconfirmed(node);
  reconcile(node);
  if (in_grace_ && all_running_nodes_synced()) end_grace();
}

void Coordinator::kill_unconfirmed(const std::string& node) {
  for (const auto& f : scheduler_.fences()) {
    if (f.node != node) continue;
    protocol::Kill msg{f.job, f.attempt, config_.kill_grace.count()};
    committer_.then([this, node, msg] { send(node, msg); });
  }
  for (const auto& [id, job] : jobs_) {
    if (job.record.state != JobState::Ending) continue;
    bool waiting = std::any_of(job.record.ranks.begin(), job.record.ranks.end(),
                               [&](const auto& r) { return r.node == node && !r.gone; });
    if (!waiting) continue;
    protocol::Kill msg{id, job.record.attempt, config_.kill_grace.count()};
    committer_.then([this, node, msg] { send(node, msg); });
  }
}

void Coordinator::on_attempt_gone(const std::string& node, const protocol::AttemptGone& m) {
  if (const store::JobRecord* owner = fence_owner(m.job)) {
    bool fenced = std::any_of(owner->fences.begin(), owner->fences.end(),
                              [&](const store::Fence& f) { return f.attempt == m.attempt && f.node == node; });
    if (fenced) return lift_fence(m.job, m.attempt, node, "its agent confirmed no process is left");
  }
  Job* job = live_job(m.job);
  if (job == nullptr || job->record.attempt != m.attempt) return;  // stale: already over
  bool there = std::any_of(job->record.ranks.begin(), job->record.ranks.end(),
                           [&](const auto& r) { return r.node == node; });
  if (!there) return;  // a node may only speak for its own ranks
  confirm_gone(*job, node, "");
}

void Coordinator::confirm_gone(Job& job, const std::string& node, const std::string& why) {
  auto& rec = job.record;
  model::JobId id = rec.id;
  int attempt = rec.attempt;
  bool changed = false;
  std::optional<int> not_ended;
  for (auto& r : rec.ranks) {
    if (r.node != node || r.gone) continue;
    if (!model::rank_ended(r.state)) {
      // The agent has nothing of this rank left: it never ran, or ended unreported.
      if (!not_ended) not_ended = r.rank;
      r.state = model::RankState::Lost;
    }
    r.gone = true;
    changed = true;
  }
  if (!changed) return;
  persist_job(job, why);
  if (rec.state == JobState::Ending) return settle_ending(job);
  if (not_ended) {
    sched::EventInfo info;
    info.rank = *not_ended;
    info.node = node;
    info.message = "rank " + std::to_string(*not_ended) + " is not running on " + node;
    job_event(id, attempt, sched::JobEvent::NodeLost, info);
  }
}

bool Coordinator::agent_lost(const std::string& node) const {
  auto it = links_.find(node);
  return it != links_.end() && it->second.lost;
}

void Coordinator::settle_ending(Job& job) {
  auto& rec = job.record;
  if (rec.state != JobState::Ending || !rec.allocation) return;
  TimePoint now = clock_.now();
  bool released = false;
  for (const auto& na : rec.allocation->nodes) {
    if (store::node_released(rec, na.node)) {
      released = scheduler_.release_node(rec.id, na.node, now).has_value() || released;
    } else if (agent_lost(na.node)) {
      // Nobody can confirm these ranks dead while the node is away: fence what they hold,
      // so the job can end (or be requeued) without them.
      auto f = scheduler_.fence_node(rec.id, na.node, now);
      if (!f) continue;
      rec.fences.push_back({f->attempt, f->node, f->gpus, f->host, f->port});
      persist_job(job, "ranks on " + na.node + " not confirmed dead (the node is lost): its GPUs" +
                           (f->port != 0 ? " and port " + std::to_string(f->port) : std::string()) +
                           " stay fenced until its agent confirms or an admin clears it");
    }
  }
  if (released) request_pass();  // those GPUs serve other jobs now
  bool all = std::all_of(rec.allocation->nodes.begin(), rec.allocation->nodes.end(),
                         [&](const auto& na) { return store::node_released(rec, na.node); });
  if (all) job_event(rec.id, rec.attempt, sched::JobEvent::RanksGone);
}

store::JobRecord* Coordinator::fence_owner(model::JobId id) {
  if (Job* j = live_job(id)) return &j->record;
  auto it = fenced_.find(id);
  return it == fenced_.end() ? nullptr : &it->second.record;
}

void Coordinator::lift_fence(model::JobId id, int attempt, const std::string& node, const std::string& why) {
  store::JobRecord* rec = fence_owner(id);
  if (rec == nullptr) return;
  auto f = std::find_if(rec->fences.begin(), rec->fences.end(),
                        [&](const store::Fence& x) { return x.attempt == attempt && x.node == node; });
  if (f == rec->fences.end()) return;
  rec->fences.erase(f);
  scheduler_.lift_fence(id, attempt, node);
  spdlog::info("job {} attempt {}: fence on {} lifted ({})", id, attempt, node, why);
  store::Change change;
  change.mutations.emplace_back(store::UpdateJob{*rec});
  change.mutations.emplace_back(store::AppendEvent{
      {id, clock_.now(), "attempt " + std::to_string(attempt) + " on " + node + ": " + why + "; its fence is lifted"}});
  committer_.enqueue(std::move(change));
  if (auto it = fenced_.find(id); it != fenced_.end() && !rec->fenced()) {
    remember_ended(std::move(it->second));  // `rec` dangles from here on
    fenced_.erase(it);
  }
  request_pass();
}

void Coordinator::reconcile(const std::string& node) {
  protocol::Reconcile r;
  for (const auto& [id, job] : jobs_) {
    // ENDING attempts are kept too: they are being stopped by Kill, with its grace.
    if (!job.record.allocation || !model::holds_resources(job.record.state)) continue;
    for (const auto& na : job.record.allocation->nodes) {
      if (na.node == node) r.keep.emplace_back(id, job.record.attempt);
    }
  }
  std::sort(r.keep.begin(), r.keep.end());
  committer_.then([this, node, r] { send(node, r); });
}

void Coordinator::on_health(const std::string& name, const protocol::Health& health) {
  const model::Node* node = scheduler_.node(name);
  if (node == nullptr) return;
  TimePoint now = clock_.now();
  bool health_drained = node->state == model::NodeState::Drained && node->reason.rfind("preflight: ", 0) == 0;
  Result<std::vector<sched::Decision>> r = std::vector<sched::Decision>{};
  if (!health.error.empty() && node->state == model::NodeState::Up) {
    spdlog::warn("node {} failed preflight: {}; draining", name, health.error);
    r = scheduler_.set_node_state(name, model::NodeState::Drained, "preflight: " + health.error, now);
  } else if (health.error.empty() && health_drained) {
    spdlog::info("node {} passed preflight again; resuming", name);
    r = scheduler_.set_node_state(name, model::NodeState::Up, "", now);
  } else {
    return;
  }
  if (r) node_changed(*scheduler_.node(name), *r);
}

void Coordinator::on_prepare_result(const std::string& node, const protocol::PrepareResult& m) {
  Job* job = live_job(m.job);
  if (job == nullptr || job->record.attempt != m.attempt || job->record.state != JobState::Starting ||
      !job->record.allocation || job->record.allocation->nodes.front().node != node) {
    return;  // stale: the job moved on
  }
  TimePoint now = clock_.now();
  if (m.ok) {
    if (job->spec.mode == model::LaunchMode::Nccl && m.nccl_id.size() != 256) {
      sched::EventInfo info{std::nullopt, node, std::nullopt, "the rank-0 agent sent no NCCL unique ID"};
      auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::LaunchFailed, now, info);
      if (r) apply(*r);
      return;
    }
    job->record.nccl_id = m.nccl_id;
    persist_job(*job, m.nccl_id.empty() ? "master port " + std::to_string(job->record.allocation->master_port) + " free on " + node
                                        : "master port free; NCCL unique ID created on " + node);
    committer_.then([this, id = m.job, attempt = m.attempt] {
      Job* j = live_job(id);
      if (j && j->record.attempt == attempt && j->record.state == JobState::Starting) send_launch(*j);
    });
    return;
  }
  sched::EventInfo info;
  info.node = node;
  info.message = m.error;
  auto event = m.port_busy ? sched::JobEvent::PortBusy : sched::JobEvent::LaunchFailed;
  if (m.port_busy) {
    info.message = "port " + std::to_string(job->record.allocation->master_port) + " on " +
                   job->record.allocation->master_addr + " is in use outside corral";
  }
  auto r = scheduler_.on_event(m.job, m.attempt, event, now, info);
  if (r) apply(*r);
}

// The rank `rank` of `job`'s attempt `attempt`, if `node` runs it: a node may only speak
// for its own ranks, and reports about another attempt are stale.
store::RankRecord* Coordinator::own_rank(Job* job, const std::string& node, int attempt, int rank) {
  if (job == nullptr || job->record.attempt != attempt) return nullptr;
  auto& ranks = job->record.ranks;
  auto it = std::find_if(ranks.begin(), ranks.end(), [&](const auto& r) { return r.rank == rank; });
  return it == ranks.end() || it->node != node ? nullptr : &*it;
}

void Coordinator::on_rank_started(const std::string& node, const protocol::RankStarted& m) {
  Job* job = any_job(m.job);
  store::RankRecord* it = own_rank(job, node, m.attempt, m.rank);
  if (it == nullptr) return;
  auto& ranks = job->record.ranks;
  it->pid = m.pid;
  if (it->state == model::RankState::Pending) it->state = model::RankState::Running;
  bool all = std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.pid != 0; });
  persist_job(*job, "");
  if (all && job->record.state == JobState::Starting && live_job(m.job) != nullptr) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::AllRanksStarted, clock_.now());
    if (r) apply(*r);
  }
}

void Coordinator::on_rank_exited(const std::string& node, const protocol::RankExited& m) {
  Job* job = any_job(m.job);
  store::RankRecord* it = own_rank(job, node, m.attempt, m.rank);
  if (it == nullptr) return;
  if (it->state == model::RankState::Exited || it->state == model::RankState::Killed) return;  // reported twice
  bool ending = job->record.state == JobState::Ending || live_job(m.job) == nullptr;
  // A rank that ends after the job's outcome was decided ended because we killed it.
  it->state = ending ? model::RankState::Killed : model::RankState::Exited;
  if (m.signal != 0) {
    it->signal = m.signal;
  } else {
    it->exit_code = m.exit_code;
  }
  persist_job(*job, "");
  if (ending) return;
  TimePoint now = clock_.now();
  sched::EventInfo info;
  info.rank = m.rank;
  info.node = node;
  if (m.signal == 0) info.exit_code = m.exit_code;
  info.message = m.reason;
  if (m.launch_failure) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::LaunchFailed, now, info);
    if (r) apply(*r);
    return;
  }
  if (m.signal != 0 || m.exit_code != 0) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::RankFailed, now, info);
    if (r) apply(*r);
    return;
  }
  bool all_ok = std::all_of(job->record.ranks.begin(), job->record.ranks.end(), [](const auto& r) {
    return r.state == model::RankState::Exited && r.exit_code == 0;
  });
  if (all_ok) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::AllRanksExitedOk, now);
    if (r) apply(*r);
  }
}

void Coordinator::on_log_data(const std::string& node, const protocol::LogData& m) {
  auto it = log_waits_.find(m.request);
  if (it == log_waits_.end() || it->second.node != node) return;
  nlohmann::json j;
  net::HttpResponse res;
  if (!m.error.empty()) {
    res = {404, "application/json", nlohmann::json{{"error", m.error}}.dump(), {}};
  } else {
    res.body = nlohmann::json{{"rank", it->second.rank},   {"node", node},         {"offset", m.offset},
                              {"data", m.data},            {"size", m.size},       {"finished", m.finished}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  it->second.respond(std::move(res));
  log_waits_.erase(it);
}

}  // namespace corral::service
