#include "coordinator/service/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/core/strings.hpp"
#include "common/model/job_spec_yaml.hpp"
#include "coordinator/store/store_rules.hpp"

namespace corral::service {

using model::JobState;

namespace {

sched::SchedOptions sched_options(const model::CoordinatorConfig& c) {
  sched::SchedOptions o;
  o.fair_share_half_life = c.fair_share_half_life;
  return o;
}

}  // namespace

Coordinator::Coordinator(net::EventLoop& loop, const Clock& clock, store::Store& store,
                         model::CoordinatorConfig config)
    : loop_(loop),
      clock_(clock),
      store_(store),
      config_(std::move(config)),
      scheduler_(sched_options(config_)),
      committer_(loop, store, [this](const Error& e) { fatal(e); }) {}

Coordinator::~Coordinator() = default;

void Coordinator::fatal(const Error& error) {
  // Memory is ahead of the disk and they can no longer be made to agree: stop, and let
  // the restart reload the truth from SQLite.
  spdlog::critical("cannot persist a state change: {}; stopping", error.to_string());
  loop_.stop();
}

Result<void> Coordinator::start() {
  auto snapshot = store_.load();
  if (!snapshot) return std::unexpected(snapshot.error());
  max_job_id_ = snapshot->max_job_id;
  TimePoint now = clock_.now();
  for (auto node : snapshot->nodes) {
    // Nobody is connected yet: every node waits for its agent, jobs keep their holds.
    Link& link = links_[node.name];
    link.last_seen = now;
    auto r = scheduler_.update_node(node, now);
    if (!r) {
      spdlog::warn("stored node {} ignored: {}", node.name, r.error().message());
      continue;
    }
    // No job goes to a node before its agent says hello.
    (void)scheduler_.set_reachable(node.name, false);
  }
  std::size_t running = 0;
  for (auto& record : snapshot->active_jobs) {
    if (model::is_terminal(record.state)) continue;  // ended; only its fences live on (below)
    auto spec = model::parse_job_spec(record.spec_yaml, "job " + std::to_string(record.id));
    if (!spec) {
      spdlog::error("job {} has a spec that no longer parses; it is failed: {}", record.id, spec.error().message());
      record.state = JobState::Failed;
      record.reason = "spec no longer valid after an upgrade";
      record.ended_at = now;
      committer_.enqueue({{store::UpdateJob{record}, store::AppendEvent{{record.id, now, "-> FAILED: " + record.reason}}}});
      continue;
    }
    Job job{record, *spec, {}};
    Result<void> ok;
    if (record.state == JobState::Pending) {
      ok = scheduler_.add_pending(record.id, record.user, *spec, record.submitted_at, record.attempt);
    } else {
      sched::SchedJob sj;
      sj.id = record.id;
      sj.user = record.user;
      sj.spec = *spec;
      sj.state = record.state;
      sj.attempt = record.attempt;
      sj.submitted_at = record.submitted_at;
      sj.started_at = record.started_at;
      sj.allocation = record.allocation;
      sj.outcome = record.outcome;
      ok = scheduler_.restore_active(std::move(sj));
      if (ok && record.state == JobState::Starting) {
        // Its Launch may have gone out before the restart: a rank its agent does not
        // report after Synced never started (see on_synced).
        for (const auto& na : record.allocation->nodes) job.launched_on[na.node] = 0;
      }
      if (ok && record.state == JobState::Ending) {
        // Nodes that confirmed before the restart serve other jobs again.
        for (const auto& na : record.allocation->nodes) {
          if (store::node_released(record, na.node)) (void)scheduler_.release_node(record.id, na.node, now);
        }
      }
      ++running;
    }
    if (!ok) {
      spdlog::error("job {} could not be restored: {}", record.id, ok.error().message());
      continue;
    }
    jobs_.emplace(record.id, std::move(job));
  }
  // Fences of earlier attempts, for live jobs and ended ones alike.
  for (const auto& record : snapshot->active_jobs) {
    for (const auto& f : record.fences) {
      auto ok = scheduler_.restore_fence({record.id, f.attempt, f.node, f.gpus, f.host, f.port});
      if (!ok) spdlog::error("job {}: fence on {} could not be restored: {}", record.id, f.node, ok.error().message());
    }
    if (model::is_terminal(record.state) && record.fenced()) {
      auto spec = model::parse_job_spec(record.spec_yaml, "job " + std::to_string(record.id));
      fenced_.insert_or_assign(record.id, Job{record, spec ? *spec : model::JobSpec{}, {}});
    }
  }
  // Every node is down until its agent says hello; the jobs on them stay as they are
  // through the grace period (set_node_state would lose them now).
  in_grace_ = running > 0;  // STARTING, RUNNING and ENDING jobs
  grace_ends_ = now + config_.reconnect_grace;
  if (in_grace_) {
    spdlog::info("restarted with {} running job(s); waiting up to {} for their agents", running,
                 format_duration(config_.reconnect_grace));
  } else {
    for (const auto* node : scheduler_.nodes()) {
      if (node->state == model::NodeState::Up) {
        (void)scheduler_.set_node_state(node->name, model::NodeState::Down, "waiting for the agent", now);
      }
    }
  }
  tick_timer_ = std::make_unique<net::Timer>(loop_);
  Duration period = std::max<Duration>(std::chrono::milliseconds(50),
                                       std::min(config_.heartbeat_interval, config_.schedule_interval) / 4);
  tick_timer_->start_repeating(period, [this] { tick(); });
  request_pass();
  return {};
}

void Coordinator::shutdown() {
  if (tick_timer_) tick_timer_->cancel();
  if (pass_timer_) pass_timer_->cancel();
  committer_.flush();
}

Coordinator::Job* Coordinator::live_job(model::JobId id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Coordinator::Job* Coordinator::any_job(model::JobId id) {
  if (Job* j = live_job(id)) return j;
  if (auto f = fenced_.find(id); f != fenced_.end()) return &f->second;
  auto it = ended_.find(id);
  return it == ended_.end() ? nullptr : &it->second;
}

void Coordinator::remember_ended(Job job) {
  model::JobId id = job.record.id;
  ended_.insert_or_assign(id, std::move(job));
  ended_order_.push_back(id);
  // Late rank reports come within seconds; keep a bounded window of ended jobs.
  while (ended_order_.size() > 4096) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
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
  if (in_grace_) return;  // placements wait until we know what still runs
  auto t0 = std::chrono::steady_clock::now();
  auto decisions = scheduler_.schedule(clock_.now());
  last_pass_end_ = std::chrono::steady_clock::now();
  last_pass_took_ = last_pass_end_ - t0;
  stats_.last_pass_ms = std::chrono::duration<double, std::milli>(last_pass_took_).count();
  ++stats_.passes;
  apply(decisions);
  // Pending reasons live in the scheduler and are shown from there (views.cpp); they are
  // not persisted, except when a job starts or ends.
}

std::vector<store::RankRecord> Coordinator::rank_records(const model::JobSpec& spec,
                                                         const model::Allocation& alloc) const {
  std::vector<store::RankRecord> out;
  for (const auto& r : model::assign_ranks(spec, alloc)) {
    store::RankRecord rec;
    rec.rank = r.rank;
    rec.node = r.node;
    rec.local_rank = r.local_rank;
    rec.gpus = r.gpus;
    if (const auto* node = scheduler_.node(r.node)) {
      for (int g : r.gpus) {
        for (const auto& gpu : node->gpus) {
          if (gpu.index == g) rec.gpu_uuids.push_back(gpu.uuid);
        }
      }
    }
    out.push_back(std::move(rec));
  }
  return out;
}

void Coordinator::persist_job(const Job& job, std::string event_text) {
  store::Change change;
  change.mutations.emplace_back(store::UpdateJob{job.record});
  if (!event_text.empty()) {
    change.mutations.emplace_back(store::AppendEvent{{job.record.id, clock_.now(), std::move(event_text)}});
  }
  committer_.enqueue(std::move(change));
}

void Coordinator::apply(const std::vector<sched::Decision>& decisions) {
  for (const auto& d : decisions) {
    if (const auto* change = std::get_if<sched::JobChange>(&d)) {
      apply_change(*change);
    } else if (const auto* kill = std::get_if<sched::KillRanks>(&d)) {
      protocol::Kill msg{kill->job, kill->attempt, config_.kill_grace.count()};
      std::vector<std::string> nodes = kill->nodes;
      // After the state change that caused it is durable.
      committer_.then([this, msg, nodes] {
        for (const auto& n : nodes) send(n, msg);
      });
    }
  }
}

void Coordinator::apply_change(const sched::JobChange& change) {
  Job* job = live_job(change.job);
  if (job == nullptr) return;  // cannot happen: the core only changes jobs we gave it
  TimePoint now = clock_.now();
  auto& rec = job->record;
  rec.state = change.to;
  rec.attempt = change.attempt;
  rec.outcome = change.outcome;
  switch (change.to) {
    case JobState::Starting:
      rec.allocation = change.allocation;
      rec.started_at = now;
      rec.ended_at.reset();
      rec.reason.clear();
      rec.nccl_id.clear();
      rec.ranks = rank_records(job->spec, *change.allocation);
      job->launched_on.clear();
      break;
    case JobState::Pending:
      // Requeued, or placed again after a busy port: nothing of the old attempt stays.
      rec.allocation.reset();
      rec.started_at.reset();
      rec.nccl_id.clear();
      rec.ranks.clear();
      job->launched_on.clear();
      rec.reason = change.from == JobState::Ending ? "Requeued: " + rec.reason : std::string("PortBusy");
      break;
    case JobState::Running:
      break;
    case JobState::Ending:
      // The outcome and its cause are decided now; the end is recorded once every rank is
      // confirmed gone.
      rec.reason = std::string(sched::to_string(change.event));
      if (change.info.rank) rec.failed_rank = change.info.rank;
      if (!change.info.node.empty() && change.event != sched::JobEvent::Cancel) rec.failed_node = change.info.node;
      if (change.info.exit_code) rec.exit_code = change.info.exit_code;
      if (change.outcome == JobState::Completed) rec.exit_code = 0;
      if (change.event == sched::JobEvent::NodeLost && !change.info.node.empty()) {
        for (auto& r : rec.ranks) {
          if (r.node == change.info.node && !model::rank_ended(r.state)) r.state = model::RankState::Lost;
        }
      }
      break;
    default:  // terminal, from ENDING (every rank gone) or PENDING (cancelled)
      rec.ended_at = now;
      if (change.from == JobState::Pending) rec.reason = std::string(sched::to_string(change.event));
      break;
  }
  persist_job(*job, change.text);
  if (change.to == JobState::Ending) return settle_ending(*job);  // its ranks may all be gone already
  if (change.to == JobState::Starting) {
    committer_.then([this, id = rec.id, attempt = rec.attempt] {
      Job* j = live_job(id);
      if (j && j->record.attempt == attempt && j->record.state == JobState::Starting) send_prepare(*j);
    });
  }
  if (model::is_terminal(change.to)) {
    ++stats_.ended[static_cast<int>(change.to)];
    Job ended = std::move(*job);
    jobs_.erase(change.job);
    committer_.then([this, id = change.job] { answer_job_waits(id); });
    if (ended.record.fenced()) {
      fenced_.insert_or_assign(change.job, std::move(ended));  // earlier attempts still hold fences
    } else {
      remember_ended(std::move(ended));
    }
    request_pass();  // its GPUs are free
  } else if (change.to == JobState::Pending) {
    request_pass();
  }
}

void Coordinator::send_prepare(const Job& job) {
  const auto& alloc = *job.record.allocation;
  protocol::Prepare p{job.record.id, job.record.attempt, alloc.master_addr, alloc.master_port,
                      job.spec.mode == model::LaunchMode::Nccl};
  send(alloc.nodes.front().node, p);
}

void Coordinator::send_launch(Job& job) {
  const auto& rec = job.record;
  const auto& alloc = *rec.allocation;
  auto ranks = model::assign_ranks(job.spec, alloc);
  protocol::Launch base;
  base.job = rec.id;
  base.attempt = rec.attempt;
  base.name = job.spec.name;
  base.user = rec.user;
  base.command = job.spec.command;
  base.workdir = job.spec.workdir;
  base.env = job.spec.env;
  for (const auto& na : alloc.nodes) base.nodes.push_back(na.node);
  base.world_size = static_cast<int>(ranks.size());
  base.local_world_size = ranks.empty() ? 0 : ranks.front().local_world_size;
  base.master_addr = alloc.master_addr;
  base.master_port = alloc.master_port;
  base.nccl_id = rec.nccl_id;
  for (std::size_t n = 0; n < alloc.nodes.size(); ++n) {
    protocol::Launch msg = base;
    for (const auto& r : ranks) {
      if (r.node_rank == static_cast<int>(n)) msg.ranks.push_back({r.rank, r.local_rank, r.node_rank, r.gpus});
    }
    const std::string& node = alloc.nodes[n].node;
    auto link = links_.find(node);
    if (link != links_.end() && link->second.connected) job.launched_on[node] = link->second.generation;
    send(node, msg);
  }
}

void Coordinator::tick() {
  TimePoint now = clock_.now();
  if (in_grace_ && now >= grace_ends_) end_grace();
  if (!in_grace_) {
    // Silent nodes are down: their jobs are lost (or requeued) and torn down elsewhere.
    for (auto& [name, link] : links_) {
      const auto* node = scheduler_.node(name);
      if (node == nullptr || node->state == model::NodeState::Down || link.lost) continue;
      if (now - link.last_seen > config_.node_timeout) {
        std::string reason = link.connected ? "no heartbeat for " + format_duration(now - link.last_seen)
                                            : "agent disconnected";
        node_lost(name, reason, now);
        if (link.conn) link.conn->close("node timed out");
      }
    }
  }
  // Job waits whose time is up see the job as it is now.
  for (auto it = job_waits_.begin(); it != job_waits_.end();) {
    if (now >= it->second.deadline) {
      it->second.respond(show_job(it->first));
      it = job_waits_.erase(it);
    } else {
      ++it;
    }
  }
  // Log requests the agent never answered.
  for (auto it = log_waits_.begin(); it != log_waits_.end();) {
    if (now > it->second.deadline) {
      it->second.respond({504, "application/json", R"({"error":"the agent did not answer in time"})", {}});
      it = log_waits_.erase(it);
    } else {
      ++it;
    }
  }
  if (now - last_periodic_pass_ >= config_.schedule_interval) {
    last_periodic_pass_ = now;
    request_pass();  // time limits and fair share move with the clock
  }
}

void Coordinator::job_event(model::JobId id, int attempt, sched::JobEvent event, const sched::EventInfo& info) {
  auto r = scheduler_.on_event(id, attempt, event, clock_.now(), info);
  if (r) {
    apply(*r);
  } else {
    spdlog::debug("job {} attempt {}: {} ignored: {}", id, attempt, sched::to_string(event), r.error().message());
  }
}

bool Coordinator::all_running_nodes_synced() const {
  for (const auto& [id, job] : jobs_) {
    if (!job.record.allocation || !model::holds_resources(job.record.state)) continue;
    for (const auto& na : job.record.allocation->nodes) {
      if (store::node_released(job.record, na.node)) continue;
      auto it = links_.find(na.node);
      if (it == links_.end() || !it->second.connected || !it->second.synced) return false;
    }
  }
  return true;
}

void Coordinator::end_grace() {
  in_grace_ = false;
  TimePoint now = clock_.now();
  spdlog::info("reconnect grace over");
  // Agents that did not come back lose their jobs; every other node has judged its own
  // ranks already, from what its agent said (on_synced). Ranks on a node that stays away
  // are not confirmed dead: their GPUs and port stay fenced until it returns or an
  // admin clears it.
  for (auto& [name, link] : links_) {
    const auto* node = scheduler_.node(name);
    if (!link.connected && !link.lost && node != nullptr && node->state != model::NodeState::Down) {
      node_lost(name, "agent did not reconnect after restart", now);
    }
  }
  request_pass();
}

}  // namespace corral::service
