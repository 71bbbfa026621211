#include "coordinator/ledger/ledger.hpp"

#include "common/core/check.hpp"
#include "common/core/hex.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "common/core/overloaded.hpp"
#include "common/core/strings.hpp"
#include "common/model/job_spec_yaml.hpp"
#include "coordinator/store/store_rules.hpp"

namespace corral::ledger {

using model::JobState;

namespace {

sched::SchedOptions sched_options(const model::CoordinatorConfig& c) {
  sched::SchedOptions o;
  o.fair_share_half_life = c.fair_share_half_life;
  return o;
}

}  // namespace

Ledger::Ledger(model::CoordinatorConfig config) : config_(std::move(config)), scheduler_(sched_options(config_)) {}

Effects Ledger::take(bool defer_rank_records) {
  settle_dependencies();
  if (!defer_rank_records) {
    for (auto& change : take_rank_records()) out_.changes.push_back(std::move(change));
  }
  Effects out = std::move(out_);
  out_ = Effects{};
  return out;
}

std::vector<store::Change> Ledger::take_rank_records() {
  std::vector<store::Change> out;
  for (model::JobId id : ranks_changed_) {
    if (const Job* job = any(id)) out.push_back({{store::UpdateJob{job->record}}});
  }
  ranks_changed_.clear();
  return out;
}

Ledger::Job* Ledger::live(model::JobId id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Ledger::Job* Ledger::any(model::JobId id) {
  return const_cast<Job*>(static_cast<const Ledger*>(this)->any_job(id));
}

const Ledger::Job* Ledger::live_job(model::JobId id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const Ledger::Job* Ledger::any_job(model::JobId id) const {
  if (const Job* j = live_job(id)) return j;
  if (auto f = fenced_.find(id); f != fenced_.end()) return &f->second;
  auto it = ended_.find(id);
  return it == ended_.end() ? nullptr : &it->second;
}

const Ledger::Link* Ledger::link(const std::string& node) const {
  auto it = links_.find(node);
  return it == links_.end() ? nullptr : &it->second;
}

bool Ledger::connected(const std::string& node) const {
  const Link* l = link(node);
  return l != nullptr && l->connected;
}

std::optional<Instant> Ledger::lost_at(const std::string& node) const {
  const Link* l = link(node);
  if (l == nullptr || l->lost || (l->connected && !l->silent)) return std::nullopt;
  // After a restart nothing is lost before the grace ends; an agent not back by then is
  // lost node_lost_timeout after the restart (its last_seen).
  if (in_grace_) return std::max(grace_ends_, l->last_seen + lost_timeout());
  return l->last_seen + lost_timeout();
}

void Ledger::send(const std::string& node, protocol::CoordinatorMessage message) {
  if (auto it = links_.find(node); it != links_.end() && !it->second.foreign.empty() &&
                                   !std::holds_alternative<protocol::Welcome>(message)) {
    return;  // another cluster's agent: no order of ours is about its jobs
  }
  out_.messages.push_back({node, std::move(message)});
}

bool Ledger::holds_foreign(const std::string& node) const {
  auto it = links_.find(node);
  return it != links_.end() && !it->second.foreign.empty();
}

namespace {
// When a rank ended: as its agent dated it, within what can be true (after its attempt
// started, not after we heard of it), so that ends held back through an outage keep their
// time and a node's wrong clock cannot date an end outside the run. Never before the
// start, even when our own clock stepped back since: a run has no negative length.
TimePoint rank_end_time(const store::JobRecord& rec, std::int64_t agent_ms, TimePoint now) {
  TimePoint at = agent_ms <= 0 ? now : std::min(from_millis(agent_ms), now);
  if (rec.started_at && at < *rec.started_at) at = *rec.started_at;
  return at;
}

// A job that ran ended when its last rank did, if every rank's end is known (they all
// exited, or were killed, and said when); otherwise when its end was decided, now.
TimePoint job_end_time(const store::JobRecord& rec, TimePoint now) {
  if (!rec.started_at) return now;
  TimePoint last = *rec.started_at;
  bool all_dated = !rec.ranks.empty();
  for (const auto& r : rec.ranks) {
    if (!r.ended_at) all_dated = false;
    if (r.ended_at) last = std::max(last, *r.ended_at);
  }
  return std::max(*rec.started_at, all_dated ? std::min(last, now) : now);
}

// A drain the agent's own word set (preflight) or its cluster's (held), which its next
// Hello lifts or sets again; any other reason is an admin's and outlives the agent.
bool agent_drain(const std::string& reason) {
  return reason.rfind("preflight: ", 0) == 0 || reason.rfind("held: ", 0) == 0;
}
}  // namespace

// ---------------------------------------------------------------- requests

namespace {
// The spec an array's element keeps: its array's limit, not its indices. Up to 10,000
// indices in each of up to 10,000 elements held 800 MB for one array.
model::JobSpec element_spec(model::JobSpec spec) {
  if (spec.array) spec.array->indices = {};
  return spec;
}
}  // namespace

Result<Ledger::Submitted> Ledger::submit(const std::string& user, model::JobSpec spec, std::string spec_text,
                                         Now now, model::Submission submission, const EndedLookup& ended) {
  now_ = now;
  const model::JobId first = max_job_id_ + 1;
  for (const auto& d : spec.dependencies) {
    bool exists = d.job < first && (any(d.job) != nullptr || (ended && ended(d.job)));
    if (!exists) {
      return make_error(ErrorCode::InvalidArgument,
                        std::string(model::to_string(d.kind)) + ": no job " + std::to_string(d.job));
    }
  }
  // An array is one request and one commit: every element a job of its own, ids in a row.
  std::vector<std::optional<store::ArrayElement>> elements;
  if (spec.array) {
    for (int index : spec.array->indices) elements.emplace_back(store::ArrayElement{first, index});
  } else {
    elements.emplace_back(std::nullopt);
  }
  Submitted out;
  out.id = first;
  const model::JobSpec kept = element_spec(spec);
  for (std::size_t i = 0; i < elements.size(); ++i) {
    const model::JobId id = first + static_cast<model::JobId>(i);
    // Only the spec can make this fail (new ids are free), so only the first element.
    if (auto added = scheduler_.add_pending(id, user, kept, now.mono); !added) {
      CORRAL_CHECK(i == 0);
      return std::unexpected(added.error());
    }
    store::JobRecord rec;
    rec.id = id;
    rec.user = user;
    rec.name = spec.name;
    rec.spec_yaml = spec_text;
    rec.state = JobState::Pending;
    rec.submitted_at = now.wall;
    rec.submission = submission;
    rec.array = elements[i];
    std::string text = "submitted by " + user;
    if (rec.array) text += " (array " + std::to_string(first) + ", index " + std::to_string(rec.array->index) + ")";
    out.change.mutations.emplace_back(store::InsertJob{rec});
    out.change.mutations.emplace_back(store::AppendEvent{{id, now.wall, std::move(text)}});
    jobs_.emplace(id, Job{std::move(rec), kept, {}, {}, false, {}, {}});
    out.ids.push_back(id);
  }
  max_job_id_ = out.ids.back();
  stats_.submitted += out.ids.size();
  if (spec.array) {
    ArrayInfo& info = arrays_[first];
    info.max_running = spec.array->max_running;
    info.live.insert(out.ids.begin(), out.ids.end());
  }
  for (model::JobId id : out.ids) watch_dependencies(jobs_.at(id), ended);
  if (spec.array) update_array(first);
  return out;
}

std::vector<model::JobId> Ledger::array_elements(model::JobId array) const {
  auto it = arrays_.find(array);
  if (it == arrays_.end()) return {};
  return {it->second.live.begin(), it->second.live.end()};
}

void Ledger::update_array(model::JobId array) {
  auto it = arrays_.find(array);
  if (it == arrays_.end()) return;
  ArrayInfo& info = it->second;
  int active = 0;
  std::vector<model::JobId> pending;
  for (auto e = info.live.begin(); e != info.live.end();) {
    const Job* job = live(*e);
    if (job == nullptr) {
      over_limit_.erase(*e);
      e = info.live.erase(e);
      continue;
    }
    if (job->record.state == JobState::Pending) {
      pending.push_back(*e);
    } else {
      ++active;
    }
    ++e;
  }
  if (info.live.empty()) {
    arrays_.erase(it);
    return;
  }
  if (info.max_running == 0) return;
  int budget = info.max_running - active;
  for (model::JobId id : pending) {
    if (unmet_.contains(id)) continue;  // held by its dependencies: it takes no place
    bool limited = budget <= 0;
    if (!limited) --budget;
    bool was = over_limit_.contains(id);
    if (limited == was) continue;
    if (limited) {
      over_limit_.insert(id);
    } else {
      over_limit_.erase(id);
    }
    update_hold(id);
  }
}

// ---------------------------------------------------------------- dependencies

namespace {

// Whether a job that ended in `state` meets a dependency of this kind (it never will
// otherwise: an end is final).
bool meets(model::DependencyKind kind, JobState state) {
  switch (kind) {
    case model::DependencyKind::AfterOk: return state == JobState::Completed;
    case model::DependencyKind::AfterAny: return true;
    case model::DependencyKind::AfterNotOk: return state != JobState::Completed;
  }
  return false;
}

std::string_view wanted(model::DependencyKind kind) {
  switch (kind) {
    case model::DependencyKind::AfterOk: return "to complete";
    case model::DependencyKind::AfterAny: return "to end";
    case model::DependencyKind::AfterNotOk: return "to end other than COMPLETED";
  }
  return "";
}

}  // namespace

std::vector<model::JobId> Ledger::dependency_targets(model::JobId id, const EndedLookup& ended) {
  // The elements of an array have the ids that follow its own, each naming the array.
  auto array_of = [&](model::JobId j) -> std::optional<store::ArrayElement> {
    if (const Job* job = any(j)) return job->record.array;
    if (ended) {
      if (auto stored = ended(j)) return stored->array;
    }
    return std::nullopt;
  };
  std::vector<model::JobId> out{id};
  auto first = array_of(id);
  if (!first || first->job != id) return out;
  for (model::JobId next = id + 1; next < id + static_cast<model::JobId>(model::kMaxArrayElements); ++next) {
    auto element = array_of(next);
    if (!element || element->job != id) break;
    out.push_back(next);
  }
  return out;
}

void Ledger::watch_dependencies(Job& job, const EndedLookup& ended) {
  const model::JobId id = job.record.id;
  if (job.record.state != JobState::Pending || job.spec.dependencies.empty()) return;
  std::vector<std::pair<model::JobId, JobState>> settled;
  auto& unmet = unmet_[id];
  for (const auto& d : job.spec.dependencies) {
    for (model::JobId target : dependency_targets(d.job, ended)) {
      unmet.insert_or_assign(target, d.kind);
      if (live(target) != nullptr) {
        dependents_[target].insert(id);
        continue;
      }
      std::optional<JobState> state;
      if (const Job* gone = any(target)) state = gone->record.state;
      if (!state && ended) {
        if (auto stored = ended(target)) state = stored->state;
      }
      // A job that vanished from the store counts as one that can never complete.
      settled.emplace_back(target, state && model::is_terminal(*state) ? *state : JobState::Cancelled);
    }
  }
  update_hold(id);
  for (const auto& [dep, state] : settled) dependency_ended(id, dep, state);
}

void Ledger::dependency_ended(model::JobId dependent, model::JobId dep, JobState state) {
  auto it = unmet_.find(dependent);
  Job* job = live(dependent);
  if (it == unmet_.end() || job == nullptr || job->record.state != JobState::Pending) return;
  auto d = it->second.find(dep);
  if (d == it->second.end()) return;
  const model::DependencyKind kind = d->second;
  it->second.erase(d);
  if (meets(kind, state)) return update_hold(dependent);
  unmet_.erase(it);
  sched::EventInfo info;
  info.message = "job " + std::to_string(dep) + " ended " + std::string(model::to_string(state)) + "; " +
                 std::string(model::to_string(kind)) + " needed it " + std::string(wanted(kind));
  auto r = scheduler_.on_event(dependent, job->record.attempt, sched::JobEvent::DependencyNeverSatisfied, now_.mono, info);
  if (r) apply(*r);
}

void Ledger::update_hold(model::JobId dependent) {
  auto it = unmet_.find(dependent);
  if (it != unmet_.end() && it->second.empty()) {
    unmet_.erase(it);
    it = unmet_.end();
    // Now it may take one of its array's places.
    if (const Job* job = live(dependent); job != nullptr && job->record.array) arrays_dirty_.insert(job->record.array->job);
  }
  if (it != unmet_.end()) {
    const auto& [first, kind] = *it->second.begin();
    std::string detail = "waiting for job " + std::to_string(first) + " " + std::string(wanted(kind)) + " (" +
                         std::string(model::to_string(kind)) + ")";
    if (it->second.size() > 1) detail += " and " + std::to_string(it->second.size() - 1) + " more";
    (void)scheduler_.set_held(dependent, sched::PendingReason{sched::PendingCode::Dependency, std::move(detail)});
    return;
  }
  if (over_limit_.contains(dependent)) {
    const Job* job = live(dependent);
    const model::JobId array = job && job->record.array ? job->record.array->job : 0;
    const int limit = arrays_.contains(array) ? arrays_.at(array).max_running : 0;
    (void)scheduler_.set_held(dependent, sched::PendingReason{sched::PendingCode::JobArrayTaskLimit,
                                                              "array " + std::to_string(array) + " runs " +
                                                                  std::to_string(limit) + " elements at once"});
    return;
  }
  (void)scheduler_.set_held(dependent, std::nullopt);
  out_.pass_wanted = true;
}

void Ledger::settle_dependencies() {
  // Each round may end more jobs (dependents cancelled), whose own dependents follow.
  while (!ended_unsettled_.empty() || !arrays_dirty_.empty()) {
    auto dirty = std::move(arrays_dirty_);
    arrays_dirty_.clear();
    for (model::JobId array : dirty) update_array(array);
    auto batch = std::move(ended_unsettled_);
    ended_unsettled_.clear();
    for (const auto& [id, state] : batch) {
      unmet_.erase(id);
      auto it = dependents_.find(id);
      if (it == dependents_.end()) continue;
      std::set<model::JobId> waiting = std::move(it->second);
      dependents_.erase(it);
      for (model::JobId w : waiting) dependency_ended(w, id, state);
    }
  }
}

Result<void> Ledger::cancel(model::JobId id, const std::string& user, bool admin, Now now) {
  now_ = now;
  Job* job = live(id);
  if (job == nullptr) return make_error(ErrorCode::NotFound, "job " + std::to_string(id) + " is not live");
  if (job->record.user != user && !admin) {
    return make_error(ErrorCode::PermissionDenied, "job " + std::to_string(id) + " belongs to " + job->record.user);
  }
  if (job->record.state == JobState::Ending) {
    return make_error(ErrorCode::Conflict, "job " + std::to_string(id) + " is already ending (" +
                                               std::string(model::to_string(job->record.outcome.value_or(JobState::Ending))) +
                                               "); its ranks are being stopped");
  }
  sched::EventInfo info;
  info.message = "cancelled by " + user;
  auto r = scheduler_.on_event(id, job->record.attempt, sched::JobEvent::Cancel, now.mono, info);
  if (!r) return std::unexpected(r.error());
  apply(*r);
  return {};
}

Result<void> Ledger::set_drained(const std::string& name, bool drained, const std::string& reason, Now now) {
  now_ = now;
  if (scheduler_.node(name) == nullptr) return make_error(ErrorCode::NotFound, "no node " + name);
  // A node whose agent is away but not lost yet is resumed as up: it still takes no new
  // job (NodeDown) until its agent is back, and is lost at node_lost_timeout if it is not.
  const Link* l = link(name);
  bool up = l != nullptr && (l->connected || !l->lost);
  model::NodeState target = drained ? model::NodeState::Drained : (up ? model::NodeState::Up : model::NodeState::Down);
  auto r = scheduler_.set_node_state(name, target, drained ? reason : (up ? "" : "agent not connected"), now.mono);
  if (!r) return make_error(ErrorCode::InvalidArgument, r.error().message());
  if (target == model::NodeState::Down) links_[name].lost = true;  // its jobs are lost with it
  node_changed(*scheduler_.node(name), *r);
  if (target == model::NodeState::Down) settle_all_ending();
  return {};
}

Result<std::vector<std::pair<model::JobId, int>>> Ledger::clear_node(const std::string& name, const std::string& by,
                                                                     Now now) {
  now_ = now;
  if (scheduler_.node(name) == nullptr) return make_error(ErrorCode::NotFound, "no node " + name);
  // A connected agent confirms by itself, unless it cannot: processes that survived
  // SIGKILL drain its node (preflight), and then an admin may decide.
  const model::Node* node = scheduler_.node(name);
  if (connected(name) && node->state != model::NodeState::Drained) {
    return make_error(ErrorCode::Conflict, "node " + name + " has its agent connected: it confirms its ranks itself");
  }
  std::vector<model::JobId> ids;
  for (const auto& [id, job] : jobs_) {
    if (job.record.state != JobState::Ending) continue;
    bool waiting = std::any_of(job.record.ranks.begin(), job.record.ranks.end(),
                               [&](const auto& r) { return r.node == name && !r.gone; });
    if (waiting) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<std::pair<model::JobId, int>> cleared;
  std::string why = "declared dead by admin " + by + " (corral nodes --clear)";
  for (model::JobId id : ids) {
    Job* job = live(id);
    if (job == nullptr) continue;
    cleared.emplace_back(id, job->record.attempt);
    spdlog::warn("admin {} declared the ranks of job {} on {} dead", by, id, name);
    confirm_gone(*job, name, "ranks on " + name + " " + why);
  }
  std::vector<sched::Fence> fences;
  for (const auto& f : scheduler_.fences()) {
    if (f.node == name) fences.push_back(f);
  }
  for (const auto& f : fences) {
    cleared.emplace_back(f.job, f.attempt);
    spdlog::warn("admin {} declared the ranks of job {} attempt {} on {} dead", by, f.job, f.attempt, name);
    lift_fence(f.job, f.attempt, name, "ranks " + why);
  }
  return cleared;
}

void Ledger::schedule(Now now) {
  now_ = now;
  if (in_grace_) return;  // placements wait until we know what still runs
  apply(scheduler_.schedule(now.mono));
  // Pending reasons live in the scheduler and are shown from there; they are not
  // persisted, except when a job starts or ends.
}

// ---------------------------------------------------------------- agents

void Ledger::agent_disconnected(const std::string& node) {
  auto it = links_.find(node);
  if (it == links_.end()) return;
  it->second.connected = false;
  it->second.synced = false;
  // The node is not lost: it has node_lost_timeout from its last heartbeat to come back,
  // and its jobs run on. But no new job goes there (pending reason NodeDown) until it does.
  (void)scheduler_.set_reachable(node, false);
}

void Ledger::agent_message(const std::string& node, const protocol::AgentMessage& message, Now now) {
  now_ = now;
  auto it = links_.find(node);
  if (it == links_.end() || !it->second.connected) return;  // not welcomed
  it->second.last_seen = now.mono;
  if (!it->second.foreign.empty()) return;  // held: heard only as alive
  std::visit(Overloaded{
                 [&](const protocol::Hello&) {},  // agent_hello
                 [&](const protocol::Heartbeat&) {},
                 [&](const protocol::Health& m) { on_health(node, m); },
                 [&](const protocol::PrepareResult& m) { on_prepare_result(node, m); },
                 [&](const protocol::RankStarted& m) { on_rank_started(node, m); },
                 [&](const protocol::RankExited& m) { on_rank_exited(node, m); },
                 [&](const protocol::LogData&) {},  // answered by the caller
                 [&](const protocol::Synced&) { on_synced(node); },
                 [&](const protocol::AttemptGone& m) { on_attempt_gone(node, m); },
                 [&](const protocol::RankJoined& m) { on_rank_joined(node, m); },
                 [&](const protocol::Inspection& m) { on_inspection(node, m); },
                 [&](const protocol::RankStall& m) { on_rank_stall(node, m); },
                 [&](const protocol::Stacks&) {},  // answered by the caller
                 [&](const protocol::RankWarning& m) { on_rank_warning(node, m); },
             },
             message);
}

// ---------------------------------------------------------------- jobs

void Ledger::apply(const std::vector<sched::Decision>& decisions) {
  for (const auto& d : decisions) {
    if (const auto* change = std::get_if<sched::JobChange>(&d)) {
      apply_change(*change);
    } else if (const auto* kill = std::get_if<sched::KillRanks>(&d)) {
      // Sent after the state change that caused it is durable.
      protocol::Kill msg{kill->job, kill->attempt, config_.kill_grace.count()};
      for (const auto& n : kill->nodes) send(n, msg);
    }
  }
}

void Ledger::apply_change(const sched::JobChange& change) {
  Job* job = live(change.job);
  if (job == nullptr) return;  // cannot happen: the core only changes jobs we gave it
  Now now = now_;
  auto& rec = job->record;
  rec.state = change.to;
  rec.attempt = change.attempt;
  rec.outcome = change.outcome;
  switch (change.to) {
    case JobState::Starting:
      rec.allocation = change.allocation;
      rec.started_at = now.wall;
      rec.ended_at.reset();
      rec.reason.clear();
      rec.detail.clear();
      rec.nccl_id.clear();
      rec.ranks = rank_records(job->spec, *change.allocation);
      job->launched_on.clear();
      job->prepare_sent_on.reset();
      job->prepared = false;
      job->rendezvous = {};
      job->hang = {};
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
      check_hang(*job);  // stalls reported while it was starting
      break;
    case JobState::Ending:
      // The outcome and its cause are decided now; the end is recorded once every rank is
      // confirmed gone.
      rec.reason = std::string(sched::to_string(change.event));
      rec.detail = change.info.message;
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
      rec.ended_at = job_end_time(rec, now.wall);
      if (change.from == JobState::Pending) {
        rec.reason = std::string(sched::to_string(change.event));
        rec.detail = change.info.message;
      }
      break;
  }
  persist_job(*job, change.text);
  if (change.to == JobState::Ending) return settle_ending(*job);  // its ranks may all be gone already
  if (change.to == JobState::Starting) {
    send_prepare(*job);
  }
  if (job->record.array && (model::is_terminal(change.to) || change.to == JobState::Pending)) {
    arrays_dirty_.insert(job->record.array->job);  // a place in its array is free again
  }
  if (change.to == JobState::Starting && rec.attempt == 0) {
    // Submission to first start (a requeued attempt's wait is not a queue's).
    const sched::SchedJob* queued = scheduler_.job(rec.id);
    std::string cls = "unknown";
    if (rec.allocation && !rec.allocation->nodes.empty() && !rec.allocation->nodes.front().gpus.empty()) {
      if (const auto* node = scheduler_.node(rec.allocation->nodes.front().node)) {
        for (const auto& g : node->gpus) {
          if (g.index == rec.allocation->nodes.front().gpus.front()) cls = g.cls.product;
        }
      }
    }
    stats_.queue_wait_by_class.try_emplace(cls, kQueueWaitBounds)
        .first->second.observe(queued == nullptr ? 0.0 : std::chrono::duration<double>(now.mono - queued->submitted_at).count());
  }
  if (model::is_terminal(change.to)) {
    ++stats_.ended[static_cast<int>(change.to)];
    ++stats_.ended_by_user[{change.to, rec.user}];
    if (change.started) stats_.run_seconds.observe(std::chrono::duration<double>(now.mono - *change.started).count());
    ended_unsettled_.emplace_back(change.job, change.to);
    Job ended = std::move(*job);
    jobs_.erase(change.job);
    out_.ended.push_back(change.job);
    if (ended.record.fenced()) {
      fenced_.insert_or_assign(change.job, std::move(ended));  // earlier attempts still hold fences
    } else {
      remember_ended(std::move(ended));
    }
    out_.pass_wanted = true;  // its GPUs are free
  } else if (change.to == JobState::Pending) {
    out_.pass_wanted = true;
  }
}

void Ledger::send_prepare(Job& job) {
  const auto& alloc = *job.record.allocation;
  protocol::Prepare p{job.record.id, job.record.attempt, alloc.master_addr, alloc.master_port,
                      job.spec.mode == model::LaunchMode::Nccl};
  const std::string& master = alloc.nodes.front().node;
  auto link = links_.find(master);
  if (link != links_.end() && link->second.connected) job.prepare_sent_on = link->second.generation;
  send(master, p);
}

void Ledger::resume_launch(Job& job, const std::string& node) {
  const auto& rec = job.record;
  if (rec.state != JobState::Starting || !rec.allocation) return;
  std::uint64_t generation = links_[node].generation;
  const std::string& master = rec.allocation->nodes.front().node;
  auto pending_on = [&](const std::string& n) {
    return std::all_of(rec.ranks.begin(), rec.ranks.end(),
                       [&](const auto& r) { return r.node != n || r.state == model::RankState::Pending; });
  };
  bool any_started = !std::all_of(rec.ranks.begin(), rec.ranks.end(),
                                  [](const auto& r) { return r.state == model::RankState::Pending; });
  if (!job.prepared && !any_started) {
    // Nothing ran that we know of: the launch starts over from Prepare (rank 0's port is
    // not bound). Only once every node of the job has synced: one that has not may yet
    // report a rank started, and then the Launch went out already.
    bool all_synced = std::all_of(rec.allocation->nodes.begin(), rec.allocation->nodes.end(), [&](const auto& na) {
      const Link* l = link(na.node);
      return l != nullptr && l->connected && l->synced;
    });
    if (all_synced && pending_on(master) && (!job.prepare_sent_on || *job.prepare_sent_on < links_[master].generation)) {
      send_prepare(job);
    }
    return;
  }
  auto sent = job.launched_on.find(node);
  if (pending_on(node) && (sent == job.launched_on.end() || sent->second < generation)) send_launch(job, node);
}

void Ledger::send_launch(Job& job, const std::string& only) {
  const auto& rec = job.record;
  const auto& alloc = *rec.allocation;
  auto ranks = model::assign_ranks(job.spec, alloc);
  protocol::Launch base;
  base.job = rec.id;
  base.attempt = rec.attempt;
  base.name = job.spec.name;
  base.user = rec.user;
  base.command = job.spec.command;
  // As sbatch: the directory it was submitted from unless the spec names one (empty: the
  // user's home), the exported environment under the spec's env.
  base.workdir = job.spec.workdir.empty() ? rec.submission.dir : job.spec.workdir;
  base.env = rec.submission.env;
  for (const auto& [k, v] : job.spec.env) model::set_env(base.env, k, v);
  if (rec.array) {
    model::set_env(base.env, "CORRAL_ARRAY_JOB_ID", std::to_string(rec.array->job));
    model::set_env(base.env, "CORRAL_ARRAY_INDEX", std::to_string(rec.array->index));
  }
  for (const auto& na : alloc.nodes) base.nodes.push_back(na.node);
  base.world_size = static_cast<int>(ranks.size());
  base.local_world_size = ranks.empty() ? 0 : ranks.front().local_world_size;
  base.master_addr = alloc.master_addr;
  base.master_port = alloc.master_port;
  base.nccl_id = rec.nccl_id;
  base.gpus_per_rank = job.spec.gpu_visibility == model::GpuVisibility::Rank;
  base.max_restarts = job.spec.retries;
  base.hang_timeout_ms = job.spec.hang_timeout.count();
  for (std::size_t n = 0; n < alloc.nodes.size(); ++n) {
    protocol::Launch msg = base;
    for (const auto& r : ranks) {
      if (r.node_rank == static_cast<int>(n)) msg.ranks.push_back({r.rank, r.local_rank, r.node_rank, r.gpus});
    }
    const std::string& node = alloc.nodes[n].node;
    if (!only.empty() && node != only) continue;
    auto link = links_.find(node);
    if (link != links_.end() && link->second.connected) job.launched_on[node] = link->second.generation;
    send(node, msg);
  }
}

void Ledger::job_event(model::JobId id, int attempt, sched::JobEvent event, const sched::EventInfo& info) {
  auto r = scheduler_.on_event(id, attempt, event, now_.mono, info);
  if (r) {
    apply(*r);
  } else {
    spdlog::debug("job {} attempt {}: {} ignored: {}", id, attempt, sched::to_string(event), r.error().message());
  }
}

bool Ledger::all_running_nodes_synced() const {
  for (const auto& [id, job] : jobs_) {
    if (!job.record.allocation || !model::holds_resources(job.record.state)) continue;
    const std::set<std::string> let_go = store::released_nodes(job.record);
    for (const auto& na : job.record.allocation->nodes) {
      if (let_go.contains(na.node)) continue;
      auto it = links_.find(na.node);
      if (it == links_.end() || !it->second.connected || !it->second.synced) return false;
    }
  }
  return true;
}

void Ledger::end_grace() {
  in_grace_ = false;
  spdlog::info("reconnect grace over");
  // Every node whose agent is back has judged its own ranks already, from what its agent
  // said (on_synced). One whose agent is not back is as silent as any other: silent
  // since the restart (restore set its last_seen), its jobs run on, and it is lost only
  // node_lost_timeout after the restart (then its ranks, not confirmed dead, keep their
  // GPUs and port fenced until it returns or an admin clears it). The next walk of the
  // links judges each.
  for (auto& [name, link] : links_) {
    const auto* node = scheduler_.node(name);
    if (!link.connected && !link.lost && node != nullptr && node->state != model::NodeState::Down &&
        now_.mono - link.last_seen >= lost_timeout()) {
      node_lost(name, "agent did not reconnect after restart");
    }
  }
  next_silence_check_ = {};
  out_.pass_wanted = true;
}

void Ledger::tick(Now now) {
  now_ = now;
  forget_ended(now.mono);
  if (in_grace_ && now.mono >= grace_ends_) end_grace();
  if (in_grace_) return;
  // A Prepare or Launch that went out on an earlier connection (or found the agent away,
  // or was decided only after the node synced, e.g. once another node reported a rank
  // started) goes out again to every synced node; resume_launch sends each at most once
  // per connection.
  for (auto& [id, job] : jobs_) {
    if (job.record.state != JobState::Starting || !job.record.allocation) continue;
    for (const auto& na : job.record.allocation->nodes) {
      const Link* l = link(na.node);
      if (l != nullptr && l->connected && l->synced) resume_launch(job, na.node);
    }
  }
  // Judging may end a job (and erase it from jobs_): the ids first.
  std::vector<model::JobId> watched;
  for (const auto& [id, job] : jobs_) {
    if (job.record.state == JobState::Starting || job.record.state == JobState::Running) watched.push_back(id);
  }
  for (model::JobId id : watched) {
    if (Job* job = live(id)) check_rendezvous(*job);
  }
  // Silent nodes: at node_timeout they take no new job and their jobs are told; at
  // node_lost_timeout they are lost, their jobs with them (or requeued) and torn down
  // elsewhere. A network blip or a stalled agent must not end healthy training.
  // Heartbeats only move a link's last_seen on, so no link reaches a deadline before the
  // earliest one the last walk saw, unless a link was added since (or came back from
  // lost, which agent_hello says): 2,000 links are walked every few seconds, not 4 times a
  // second. They all run on the monotonic clock: a wall-clock step is no silence.
  const Duration lost_after = lost_timeout();
  if (now.mono < next_silence_check_ && next_silence_check_ - now.mono <= lost_after &&
      links_.size() == links_at_silence_check_) {
    return;
  }
  next_silence_check_ = Instant::max();
  links_at_silence_check_ = links_.size();
  for (auto& [name, link] : links_) {
    // (The time first: looking each of 2,000 nodes up by name, 4 times a second, was 6 %
    // of an idle coordinator's CPU samples.)
    if (link.lost) continue;
    const Duration silent_for = now.mono - link.last_seen;
    if (silent_for <= config_.node_timeout) {
      next_silence_check_ = std::min(next_silence_check_, link.last_seen + config_.node_timeout);
      continue;
    }
    const auto* node = scheduler_.node(name);
    if (node == nullptr || node->state == model::NodeState::Down) continue;
    if (silent_for <= lost_after) {
      if (!link.silent) node_silent(name, link);
      next_silence_check_ = std::min(next_silence_check_, link.last_seen + lost_after);
      continue;
    }
    bool link_open = link.silent ? link.silent_link_open : link.connected;
    std::string reason = (link_open ? "no heartbeat for " : "agent disconnected, nothing heard for ") +
                         format_duration(silent_for);
    node_lost(name, reason);
    if (link.connected) out_.close.emplace_back(name, "node timed out");
  }
}

std::vector<model::JobId> Ledger::jobs_on(const std::string& node) const {
  std::vector<model::JobId> ids;
  for (const auto& [id, job] : jobs_) {
    if (!job.record.allocation || !model::holds_resources(job.record.state)) continue;
    bool there = std::any_of(job.record.ranks.begin(), job.record.ranks.end(),
                             [&](const auto& r) { return r.node == node && !r.gone; });
    if (there) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Not lost yet: its ranks may well run on (a network blip, a stalled agent), and an agent
// back within node_lost_timeout lists them in its Hello and carries on. A job whose rank
// elsewhere fails still ends at once; its ranks here stay held until this agent confirms
// them dead (its Kill goes out after it Synced) or the node is lost and they are fenced.
void Ledger::node_silent(const std::string& name, Link& link) {
  const Duration silent_for = now_.mono - link.last_seen;
  link.silent = true;
  link.silent_link_open = link.connected;
  (void)scheduler_.set_reachable(name, false);
  link.silent_from = link.last_seen;
  if (link.connected) {
    // Heartbeats stopped on an open link: it is as good as dead (the WebSocket idle
    // timeout would close it too), and the agent dials again and says what it runs in its
    // Hello. Until the close is done, what comes on it is still applied: the service
    // acknowledges it.
    out_.close.emplace_back(name, "no heartbeat for " + format_duration(silent_for));
  }
  spdlog::warn("node {} is silent ({} for {}): no new job goes there; it is lost at {}", name,
               link.silent_link_open ? "no heartbeat" : "agent disconnected", format_duration(silent_for),
               format_time(now_.date_of(link.last_seen + lost_timeout())));
  for (model::JobId id : jobs_on(name)) {
    std::string text = "node " + name + " is silent (" +
                       (link.silent_link_open ? "no heartbeat" : "its agent disconnected") +
                       ", nothing heard for " + format_duration(silent_for) +
                       "): its ranks there are taken for running until " +
                       format_time(now_.date_of(link.last_seen + lost_timeout())) + " (node_lost_timeout), then lost";
    out_.changes.push_back({{store::AppendEvent{{id, now_.wall, std::move(text)}}}});
  }
  out_.pass_wanted = true;  // pending reasons: NodeDown
}

void Ledger::node_changed(const model::Node& node, const std::vector<sched::Decision>& decisions) {
  next_silence_check_ = {};  // a node that changed state may be one tick's walk skipped
  out_.changes.push_back({{store::UpsertNode{node}}});
  apply(decisions);
  out_.pass_wanted = true;
}

// The node's agent is gone: the node is down and its jobs are lost. An admin's drain
// outlives that (maintenance often means stopping the agent or rebooting the node): the
// node stays drained with the admin's reason, its agent not connected, until resumed.
void Ledger::node_lost(const std::string& name, const std::string& reason) {
  Now now = now_;
  const model::Node* node = scheduler_.node(name);
  if (node == nullptr) return;
  links_[name].lost = true;
  spdlog::warn("node {} is lost: {}", name, reason);
  bool admin_drained = node->state == model::NodeState::Drained && !agent_drain(node->reason);
  std::string drain_reason = node->reason;
  auto r = scheduler_.set_node_state(name, model::NodeState::Down, reason, now.mono);
  if (!r) return;
  if (admin_drained) {
    auto kept = scheduler_.set_node_state(name, model::NodeState::Drained, drain_reason, now.mono);
    if (kept) r->insert(r->end(), kept->begin(), kept->end());
  }
  node_changed(*scheduler_.node(name), *r);
  // Jobs that were ending already: their ranks there will not be confirmed soon.
  settle_all_ending();
}

void Ledger::settle_all_ending() {
  std::vector<model::JobId> ending;
  for (const auto& [id, job] : jobs_) {
    if (job.record.state == JobState::Ending) ending.push_back(id);
  }
  for (model::JobId id : ending) {
    if (Job* job = live(id)) settle_ending(*job);
  }
}

Result<void> Ledger::agent_hello(const std::string& name, protocol::Hello hello, Now now) {
  now_ = now;
  Link& link = links_[name];
  link.connected = true;
  link.driver = hello.driver;
  link.cuda = hello.cuda;
  link.reported = hello.running;
  // Back from a silence its jobs were told of (a loss ended that story instead).
  if (link.silent && !link.lost) link.back_after = now.mono - link.silent_from;
  link.last_seen = now.mono;
  link.lost = false;
  link.silent = false;
  link.synced = false;
  ++link.generation;
  link.foreign = !hello.cluster.empty() && !cluster_.empty() && hello.cluster != cluster_ ? hello.cluster : "";
  if (!link.foreign.empty()) link.reported.clear();
  next_silence_check_ = std::min(next_silence_check_, now.mono + config_.node_timeout);

  model::Node node;
  node.name = name;
  node.address = hello.address;
  node.ports = hello.ports;
  node.simulated = hello.simulated;
  node.gpus = std::move(hello.gpus);
  node.state = model::NodeState::Up;
  const model::Node* known = scheduler_.node(name);
  bool admin_drained = known && known->state == model::NodeState::Drained && !agent_drain(known->reason);
  if (!link.foreign.empty()) {
    // Its ranks are another cluster's (ids that may be ours too): it gets no work and no
    // order, and nothing it runs is judged, until an operator decides.
    node.state = model::NodeState::Drained;
    node.reason = "held: this node's agent serves cluster " + link.foreign + ", not this coordinator's cluster " +
                  cluster_ + "; it keeps the ranks it runs and this coordinator ignores its reports. Restart its "
                  "corral-agent to join cluster " + cluster_ + " (which kills those ranks), or start the coordinator "
                  "on cluster " + link.foreign + "'s database";
    spdlog::error("node {}: {}", name, node.reason);
  } else if (admin_drained) {
    node.state = model::NodeState::Drained;
    node.reason = known->reason;
  } else if (!hello.health_error.empty()) {
    node.state = model::NodeState::Drained;
    node.reason = "preflight: " + hello.health_error;
  }
  auto decisions = scheduler_.update_node(node, now.mono);
  if (!decisions) {
    link.connected = false;
    (void)scheduler_.set_reachable(name, false);
    return make_error(ErrorCode::InvalidArgument, decisions.error().message());
  }
  (void)scheduler_.set_reachable(name, link.foreign.empty());
  spdlog::info("agent {} joined: {} GPU(s), address {}{}", name, node.gpus.size(), node.address,
               node.simulated ? ", simulated" : "");
  send(name, protocol::Welcome{protocol::kProtocolVersion, config_.heartbeat_interval.count(),
                               config_.kill_grace.count(), cluster_});
  node_changed(*scheduler_.node(name), *decisions);
  // Its ranks are judged once it has Synced: the reports it held back come first.
  return {};
}

// Every report the agent held back has been applied: what it neither runs (its Hello)
// nor reported is not running there. Such a rank is lost, and only then; a restart of
// ours alone never fails or requeues a job.
void Ledger::on_synced(const std::string& node) {
  Link& link = links_[node];
  link.synced = true;
  std::vector<model::JobId> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (model::JobId id : ids) {
    Job* job = live(id);
    if (job == nullptr) continue;
    auto& rec = job->record;
    if (rec.state != JobState::Starting && rec.state != JobState::Running) continue;
    for (const auto& r : rec.ranks) {
      // A rank not started yet is not lost: its Launch (or the Prepare before it) is
      // sent again if it went out on an earlier connection (resume_launch, below).
      if (r.node != node || model::rank_ended(r.state) || r.state == model::RankState::Pending) continue;
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
  for (model::JobId id : ids) {
    if (Job* job = live(id)) resume_launch(*job, node);
  }
  if (link.back_after) {
    for (model::JobId id : jobs_on(node)) {
      out_.changes.push_back({{store::AppendEvent{
          {id, now_.wall,
           "node " + node + " is back after " + format_duration(*link.back_after) + " of silence"}}}});
    }
    spdlog::info("node {} is back after {} of silence", node, format_duration(*link.back_after));
    link.back_after.reset();
  }
  kill_unconfirmed(node);
  reconcile(node);
  if (in_grace_ && all_running_nodes_synced()) end_grace();
}

void Ledger::kill_unconfirmed(const std::string& node) {
  for (const auto& f : scheduler_.fences()) {
    if (f.node != node) continue;
    protocol::Kill msg{f.job, f.attempt, config_.kill_grace.count()};
    send(node, msg);
  }
  for (const auto& [id, job] : jobs_) {
    if (job.record.state != JobState::Ending) continue;
    bool waiting = std::any_of(job.record.ranks.begin(), job.record.ranks.end(),
                               [&](const auto& r) { return r.node == node && !r.gone; });
    if (!waiting) continue;
    protocol::Kill msg{id, job.record.attempt, config_.kill_grace.count()};
    send(node, msg);
  }
}

void Ledger::on_attempt_gone(const std::string& node, const protocol::AttemptGone& m) {
  if (const store::JobRecord* owner = fence_owner(m.job)) {
    bool fenced = std::any_of(owner->fences.begin(), owner->fences.end(),
                              [&](const store::Fence& f) { return f.attempt == m.attempt && f.node == node; });
    if (fenced) return lift_fence(m.job, m.attempt, node, "its agent confirmed no process is left");
  }
  Job* job = live(m.job);
  if (job == nullptr || job->record.attempt != m.attempt) return;  // stale: already over
  bool there = std::any_of(job->record.ranks.begin(), job->record.ranks.end(),
                           [&](const auto& r) { return r.node == node; });
  if (!there) return;  // a node may only speak for its own ranks
  confirm_gone(*job, node, "");
}

void Ledger::confirm_gone(Job& job, const std::string& node, const std::string& why) {
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

bool Ledger::agent_lost(const std::string& node) const {
  auto it = links_.find(node);
  return it != links_.end() && it->second.lost;
}

void Ledger::settle_ending(Job& job) {
  auto& rec = job.record;
  if (rec.state != JobState::Ending || !rec.allocation) return;
  Now now = now_;
  bool released = false;
  bool all = true;  // every node let go, by its ranks' confirmation or a fence
  const std::set<std::string> let_go = store::released_nodes(rec);
  for (const auto& na : rec.allocation->nodes) {
    if (let_go.contains(na.node)) {
      // Each node once (the scheduler knows which it has): a gang of a thousand nodes
      // confirms them one by one.
      const sched::SchedJob* held = scheduler_.job(rec.id);
      if (held == nullptr || held->released(na.node)) continue;
      released = scheduler_.release_node(rec.id, na.node, now.mono).has_value() || released;
    } else if (agent_lost(na.node)) {
      // Nobody can confirm these ranks dead while the node is away: fence what they hold,
      // so the job can end (or be requeued) without them.
      auto f = scheduler_.fence_node(rec.id, na.node, now.mono);
      if (!f) {
        all = false;
        continue;
      }
      rec.fences.push_back({f->attempt, f->node, f->gpus, f->host, f->port});
      persist_job(job, "ranks on " + na.node + " not confirmed dead (the node is lost): its GPUs" +
                           (f->port != 0 ? " and port " + std::to_string(f->port) : std::string()) +
                           " stay fenced until its agent confirms or an admin clears it");
    } else {
      all = false;
    }
  }
  if (released) out_.pass_wanted = true;  // those GPUs serve other jobs now
  if (all) job_event(rec.id, rec.attempt, sched::JobEvent::RanksGone);
}

store::JobRecord* Ledger::fence_owner(model::JobId id) {
  if (Job* j = live(id)) return &j->record;
  auto it = fenced_.find(id);
  return it == fenced_.end() ? nullptr : &it->second.record;
}

void Ledger::lift_fence(model::JobId id, int attempt, const std::string& node, const std::string& why) {
  store::JobRecord* rec = fence_owner(id);
  if (rec == nullptr) return;
  auto f = std::find_if(rec->fences.begin(), rec->fences.end(),
                        [&](const store::Fence& x) { return x.attempt == attempt && x.node == node; });
  if (f == rec->fences.end()) return;
  rec->fences.erase(f);
  scheduler_.lift_fence(id, attempt, node);
  if (rec->state == JobState::Ending && rec->attempt == attempt) {
    // Still ending (waiting for other nodes): that node is confirmed now, not fenced.
    for (auto& r : rec->ranks) {
      if (r.node != node) continue;
      if (!model::rank_ended(r.state)) r.state = model::RankState::Lost;
      r.gone = true;
    }
  }
  spdlog::info("job {} attempt {}: fence on {} lifted ({})", id, attempt, node, why);
  store::Change change;
  change.mutations.emplace_back(store::UpdateJob{*rec});
  change.mutations.emplace_back(store::AppendEvent{
      {id, now_.wall, "attempt " + std::to_string(attempt) + " on " + node + ": " + why + "; its fence is lifted"}});
  out_.changes.push_back(std::move(change));
  if (auto it = fenced_.find(id); it != fenced_.end() && !rec->fenced()) {
    remember_ended(std::move(it->second));  // `rec` dangles from here on
    fenced_.erase(it);
  }
  out_.pass_wanted = true;
}

void Ledger::reconcile(const std::string& node) {
  protocol::Reconcile r;
  for (const auto& [id, job] : jobs_) {
    // ENDING attempts are kept too: they are being stopped by Kill, with its grace.
    if (!job.record.allocation || !model::holds_resources(job.record.state)) continue;
    for (const auto& na : job.record.allocation->nodes) {
      if (na.node == node) r.keep.emplace_back(id, job.record.attempt);
    }
  }
  std::sort(r.keep.begin(), r.keep.end());
  send(node, r);
}

void Ledger::on_health(const std::string& name, const protocol::Health& health) {
  const model::Node* node = scheduler_.node(name);
  if (node == nullptr) return;
  Now now = now_;
  bool health_drained = node->state == model::NodeState::Drained && node->reason.rfind("preflight: ", 0) == 0;
  Result<std::vector<sched::Decision>> r = std::vector<sched::Decision>{};
  if (!health.error.empty() && node->state == model::NodeState::Up) {
    spdlog::warn("node {} failed preflight: {}; draining", name, health.error);
    r = scheduler_.set_node_state(name, model::NodeState::Drained, "preflight: " + health.error, now.mono);
  } else if (health.error.empty() && health_drained) {
    spdlog::info("node {} passed preflight again; resuming", name);
    r = scheduler_.set_node_state(name, model::NodeState::Up, "", now.mono);
  } else {
    return;
  }
  if (r) node_changed(*scheduler_.node(name), *r);
}

void Ledger::on_prepare_result(const std::string& node, const protocol::PrepareResult& m) {
  Job* job = live(m.job);
  if (job == nullptr || job->record.attempt != m.attempt || job->record.state != JobState::Starting ||
      !job->record.allocation || job->record.allocation->nodes.front().node != node ||
      job->record.allocation->master_port != m.master_port) {
    return;  // stale: the job moved on (to another port, too: PortBusy keeps the attempt)
  }
  Now now = now_;
  if (m.ok) {
    if (job->spec.mode == model::LaunchMode::Nccl && !check_nccl_unique_id(m.nccl_id)) {
      sched::EventInfo info{std::nullopt, node, std::nullopt, "the rank-0 agent sent no NCCL unique ID"};
      auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::LaunchFailed, now.mono, info);
      if (r) apply(*r);
      return;
    }
    if (job->prepared) return;  // sent again after a reconnect: answered already
    job->prepared = true;
    job->record.nccl_id = m.nccl_id;
    persist_job(*job, m.nccl_id.empty() ? "master port " + std::to_string(job->record.allocation->master_port) + " free on " + node
                                        : "master port free; NCCL unique ID created on " + node);
    send_launch(*job);
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
  auto r = scheduler_.on_event(m.job, m.attempt, event, now.mono, info);
  if (r) apply(*r);
}

// The rank `rank` of `job`'s attempt `attempt`, if `node` runs it: a node may only speak
// for its own ranks, and reports about another attempt are stale.
store::RankRecord* Ledger::own_rank(Job* job, const std::string& node, int attempt, int rank) {
  if (job == nullptr || job->record.attempt != attempt) return nullptr;
  auto& ranks = job->record.ranks;
  auto it = std::find_if(ranks.begin(), ranks.end(), [&](const auto& r) { return r.rank == rank; });
  return it == ranks.end() || it->node != node ? nullptr : &*it;
}

void Ledger::on_rank_started(const std::string& node, const protocol::RankStarted& m) {
  Job* job = any(m.job);
  store::RankRecord* it = own_rank(job, node, m.attempt, m.rank);
  if (it == nullptr) return;
  auto& ranks = job->record.ranks;
  it->pid = m.pid;
  if (it->state == model::RankState::Pending) it->state = model::RankState::Running;
  bool all = std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.pid != 0; });
  persist_ranks(*job, "");
  if (all && job->record.state == JobState::Starting && live_job(m.job) != nullptr) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::AllRanksStarted, now_.mono);
    if (r) apply(*r);
  }
}

void Ledger::on_rank_joined(const std::string& node, const protocol::RankJoined& m) {
  Job* job = live(m.job);
  store::RankRecord* rank = own_rank(job, node, m.attempt, m.rank);
  if (rank == nullptr || rank->joined_at || model::rank_ended(rank->state)) return;
  rank->joined_at = now_.wall;
  const auto& ranks = job->record.ranks;
  bool all = std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return r.joined_at.has_value(); });
  std::string event;
  if (auto started = attempt_started(m.job); all && started) {
    event = "rendezvous complete after " + std::to_string((now_.mono - *started).count()) + " ms: all " +
            std::to_string(ranks.size()) + " ranks checked in";
  }
  persist_ranks(*job, std::move(event));
}

std::optional<Instant> Ledger::attempt_started(model::JobId id) const {
  const sched::SchedJob* held = scheduler_.job(id);
  return held == nullptr ? std::nullopt : held->started_at;
}

void Ledger::check_rendezvous(Job& job) {
  using Phase = Job::Rendezvous::Phase;
  auto& rec = job.record;
  auto& rv = job.rendezvous;
  if (rv.phase == Phase::Done || job.spec.mode != model::LaunchMode::Torch) return;
  if (job.spec.rendezvous_timeout.count() <= 0 || !rec.started_at || rec.ranks.size() < 2) return;
  if (rv.phase == Phase::Inspecting) {
    if (rv.asked.empty() || now_.mono >= rv.answers_by) end_rendezvous(job);
    return;
  }
  auto started = attempt_started(rec.id);
  if (!started || now_.mono < *started + job.spec.rendezvous_timeout) return;
  // Missing: ranks that neither checked in nor ended (one that exited 0 before it was
  // seen did its part).
  std::map<std::string, std::vector<int>> missing;  // by node
  bool any_joined = false;
  for (const auto& r : rec.ranks) {
    any_joined = any_joined || r.joined_at.has_value();
    if (!r.joined_at && !model::rank_ended(r.state)) missing[r.node].push_back(r.rank);
  }
  if (missing.empty()) {
    rv.phase = Phase::Done;
    return;
  }
  if (!any_joined) {
    // No rank ever listened on MASTER_PORT or connected to it: the program does not meet
    // through MASTER_ADDR/MASTER_PORT at all (its own launcher, a single-process tool). It
    // is not judged by a rendezvous it does not use.
    rv.phase = Phase::Done;
    persist_job(job, "no rank checked in within " + format_duration(job.spec.rendezvous_timeout) +
                         " (rank 0 never listened on MASTER_PORT): the job does not seem to meet through "
                         "MASTER_ADDR/MASTER_PORT; the rendezvous deadline is not applied");
    return;
  }
  // A node whose agent is away (or silent) may hold check-ins in its outbox: judged once
  // it is back (a node that stays away is lost, and its job with it, at node_lost_timeout).
  for (const auto& [node, ranks] : missing) {
    const Link* l = link(node);
    if (l == nullptr || !l->connected || !l->synced || l->silent) return;
  }
  rv.phase = Phase::Inspecting;
  rv.answers_by = now_.mono + kInspectAnswerTime;
  for (auto& [node, ranks] : missing) {
    rv.asked.insert(node);
    send(node, protocol::Inspect{rec.id, rec.attempt, ranks});
  }
}

void Ledger::on_inspection(const std::string& node, const protocol::Inspection& m) {
  Job* job = live(m.job);
  if (job == nullptr || job->record.attempt != m.attempt) return;
  auto& rv = job->rendezvous;
  if (rv.phase != Job::Rendezvous::Phase::Inspecting || rv.asked.erase(node) == 0) return;
  for (const auto& p : m.ranks) rv.found.emplace_back(node, p);
  if (rv.asked.empty()) end_rendezvous(*job);
}

namespace {

// "rank 3 on gpu-b: alive, pid 812 (python3) S (sleeping) in hrtimer_nanosleep, 0.04 s of CPU"
std::string describe_rank_process(const std::string& node, const protocol::RankProcess& p) {
  std::string out = "rank " + std::to_string(p.rank) + " on " + node + ": ";
  if (!p.alive) return out + "no process left";
  char cpu[32];
  std::snprintf(cpu, sizeof(cpu), "%.2f", static_cast<double>(p.cpu_ms) / 1000.0);
  out += "alive, pid " + std::to_string(p.pid) + " (" + p.command + ") " + p.state;
  if (!p.wchan.empty()) out += " in " + p.wchan;
  out += std::string(", ") + cpu + " s of CPU since it started";
  if (p.processes > 1) out += " (" + std::to_string(p.processes) + " processes)";
  return out;
}

}  // namespace

void Ledger::end_rendezvous(Job& job) {
  auto& rec = job.record;
  auto& rv = job.rendezvous;
  rv.phase = Job::Rendezvous::Phase::Done;
  std::vector<std::string> missing;
  std::optional<int> first_rank;
  std::string first_node;
  std::size_t joined = 0;
  for (const auto& r : rec.ranks) {
    if (r.joined_at) ++joined;
    if (r.joined_at || model::rank_ended(r.state)) continue;
    if (!first_rank) {
      first_rank = r.rank;
      first_node = r.node;
    }
    auto found = std::find_if(rv.found.begin(), rv.found.end(),
                              [&](const auto& f) { return f.first == r.node && f.second.rank == r.rank; });
    missing.push_back(found != rv.found.end()
                          ? describe_rank_process(r.node, found->second)
                          : "rank " + std::to_string(r.rank) + " on " + r.node + ": its agent did not answer");
  }
  rv.found.clear();
  rv.asked.clear();
  if (missing.empty()) return;  // they checked in while we asked
  std::string message = "rendezvous not complete after " + format_duration(job.spec.rendezvous_timeout) + ": " +
                        std::to_string(joined) + " of " + std::to_string(rec.ranks.size()) +
                        " ranks checked in; missing " + join(missing, "; ");
  spdlog::warn("job {}: {}", rec.id, message);
  if (job.spec.on_rendezvous_timeout == model::OnRendezvousTimeout::Warn) {
    persist_job(job, message);
    return;
  }
  sched::EventInfo info;
  info.rank = first_rank;
  info.node = first_node;
  info.message = message;
  job_event(rec.id, rec.attempt, sched::JobEvent::RendezvousTimeout, info);
}

void Ledger::on_rank_stall(const std::string& node, const protocol::RankStall& m) {
  Job* job = live(m.job);
  store::RankRecord* rank = own_rank(job, node, m.attempt, m.rank);
  if (rank == nullptr || model::rank_ended(rank->state)) return;
  if (job->record.state != JobState::Starting && job->record.state != JobState::Running) return;
  auto& hang = job->hang;
  if (!m.stalled) {
    if (hang.stalled.erase(m.rank) > 0 && hang.reported) {
      hang.reported = false;
      persist_ranks(*job, "rank " + std::to_string(m.rank) + " on " + node + " makes progress again");
    }
    return;
  }
  hang.stalled[m.rank] = {now_.mono - Duration(m.idle_ms), m.state};
  check_hang(*job);
}

void Ledger::check_hang(Job& job) {
  auto& hang = job.hang;
  if (hang.reported || job.record.state != JobState::Running || job.spec.hang_timeout.count() <= 0) return;
  // A hang: every rank still running has stopped.
  std::vector<const store::RankRecord*> ranks;
  for (const auto& r : job.record.ranks) {
    if (model::rank_ended(r.state)) continue;
    if (!hang.stalled.contains(r.rank)) return;
    ranks.push_back(&r);
  }
  if (ranks.empty()) return;
  std::stable_sort(ranks.begin(), ranks.end(), [&](const auto* a, const auto* b) {
    return hang.stalled.at(a->rank).since < hang.stalled.at(b->rank).since;
  });
  hang.reported = true;
  // The first to stop, and those that stopped within a second of it (the agents look
  // once a second): the others most likely wait for them.
  const Instant first = hang.stalled.at(ranks.front()->rank).since;
  auto describe = [&](const store::RankRecord& r) {
    const auto& stall = hang.stalled.at(r.rank);
    return "rank " + std::to_string(r.rank) + " on " + r.node + " (" + stall.state + ", since " +
           format_time(now_.date_of(stall.since)) + ")";
  };
  std::vector<std::string> firsts;
  std::vector<std::string> later;
  std::vector<int> first_ranks;
  for (const auto* r : ranks) {
    if (hang.stalled.at(r->rank).since - first <= std::chrono::seconds(1)) {
      firsts.push_back(describe(*r));
      first_ranks.push_back(r->rank);
    } else {
      later.push_back(describe(*r));
    }
  }
  for (int r : first_ranks) rank_warning(job, r, "stopped first in the hang found at " + format_time(now_.wall));
  std::string text = "hang: no rank has used CPU or its GPUs for " + format_duration(job.spec.hang_timeout) +
                     " (launch.hang_timeout); stopped first: " + join(firsts, ", ");
  if (!later.empty()) text += "; then " + join(later, ", ");
  text += "; corral stack " + std::to_string(job.record.id) + " shows where each rank is";
  spdlog::warn("job {}: {}", job.record.id, text);
  persist_ranks(job, std::move(text));
}

bool Ledger::rank_warning(Job& job, int rank, std::string warning) {
  for (auto& r : job.record.ranks) {
    if (r.rank != rank) continue;
    if (std::find(r.warnings.begin(), r.warnings.end(), warning) != r.warnings.end()) return false;
    if (r.warnings.size() >= kMaxRankWarnings) r.warnings.erase(r.warnings.begin());
    r.warnings.push_back(std::move(warning));
    return true;
  }
  return false;
}

void Ledger::on_rank_warning(const std::string& node, const protocol::RankWarning& m) {
  Job* job = live(m.job);
  store::RankRecord* rank = own_rank(job, node, m.attempt, m.rank);
  if (rank == nullptr || m.warning.empty()) return;
  if (!rank_warning(*job, m.rank, m.warning)) return;
  spdlog::warn("job {}: rank {} on {}: {}", m.job, m.rank, node, m.warning);
  persist_ranks(*job, "rank " + std::to_string(m.rank) + " on " + node + ": " + m.warning);
}

void Ledger::on_rank_exited(const std::string& node, const protocol::RankExited& m) {
  Job* job = any(m.job);
  store::RankRecord* it = own_rank(job, node, m.attempt, m.rank);
  if (it == nullptr) return;
  if (it->state == model::RankState::Exited || it->state == model::RankState::Killed) return;  // reported twice
  bool ending = job->record.state == JobState::Ending || live_job(m.job) == nullptr;
  // A rank that ends after the job's outcome was decided ended because we killed it.
  it->state = ending ? model::RankState::Killed : model::RankState::Exited;
  it->ended_at = rank_end_time(job->record, m.ended_at_ms, now_.wall);
  if (m.signal != 0) {
    it->signal = m.signal;
  } else {
    it->exit_code = m.exit_code;
  }
  persist_ranks(*job, "");
  if (ending) return;
  Now now = now_;
  sched::EventInfo info;
  info.rank = m.rank;
  info.node = node;
  if (m.signal == 0) info.exit_code = m.exit_code;
  info.message = m.reason;
  if (m.launch_failure) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::LaunchFailed, now.mono, info);
    if (r) apply(*r);
    return;
  }
  if (m.signal != 0 || m.exit_code != 0) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::RankFailed, now.mono, info);
    if (r) apply(*r);
    return;
  }
  bool all_ok = std::all_of(job->record.ranks.begin(), job->record.ranks.end(), [](const auto& r) {
    return r.state == model::RankState::Exited && r.exit_code == 0;
  });
  if (all_ok) {
    auto r = scheduler_.on_event(m.job, m.attempt, sched::JobEvent::AllRanksExitedOk, now.mono);
    if (r) apply(*r);
    return;
  }
  check_hang(*job);  // the one still moving may have been this one
}

void Ledger::remember_ended(Job job) {
  model::JobId id = job.record.id;
  ended_.insert_or_assign(id, std::move(job));
  ended_order_.emplace_back(id, now_.mono);
  forget_ended(now_.mono);
}

void Ledger::forget_ended(Instant now) {
  // Late rank reports come within seconds, and a job's agents that are away keep it
  // fenced (fenced_): a window of a minute, and at most 4,096 jobs. Older ones are read
  // from the store; memory follows the work, not the history.
  constexpr std::size_t kEndedKept = 4096;
  constexpr Duration kEndedKeptFor = std::chrono::minutes(1);
  while (!ended_order_.empty() &&
         (ended_order_.size() > kEndedKept || ended_order_.front().second + kEndedKeptFor <= now)) {
    const model::JobId id = ended_order_.front().first;
    ended_order_.pop_front();
    auto it = ended_.find(id);
    if (it == ended_.end()) continue;
    // A late rank report not written yet is written now, while the record is at hand.
    if (ranks_changed_.erase(id) > 0) out_.changes.push_back({{store::UpdateJob{it->second.record}}});
    ended_.erase(it);
  }
}

std::vector<store::RankRecord> Ledger::rank_records(const model::JobSpec& spec,
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

void Ledger::persist_ranks(const Job& job, std::string event_text) {
  ranks_changed_.insert(job.record.id);
  if (!event_text.empty()) {
    out_.changes.push_back({{store::AppendEvent{{job.record.id, now_.wall, std::move(event_text)}}}});
  }
}

void Ledger::persist_job(const Job& job, std::string event_text) {
  // This write carries the ranks too.
  ranks_changed_.erase(job.record.id);
  store::Change change;
  change.mutations.emplace_back(store::UpdateJob{job.record});
  if (!event_text.empty()) {
    change.mutations.emplace_back(store::AppendEvent{{job.record.id, now_.wall, std::move(event_text)}});
  }
  out_.changes.push_back(std::move(change));
}

Result<void> Ledger::restore(store::Snapshot snapshot, Now now, const EndedLookup& ended) {
  now_ = now;
  max_job_id_ = snapshot.max_job_id;
  for (auto node : snapshot.nodes) {
    // Nobody is connected yet: every node waits for its agent, jobs keep their holds.
    Link& link = links_[node.name];
    link.last_seen = now.mono;
    auto r = scheduler_.update_node(node, now.mono);
    if (!r) {
      spdlog::warn("stored node {} ignored: {}", node.name, r.error().message());
      continue;
    }
    // No job goes to a node before its agent says hello.
    (void)scheduler_.set_reachable(node.name, false);
  }
  std::size_t running = 0;
  for (auto& record : snapshot.active_jobs) {
    if (model::is_terminal(record.state)) continue;  // ended; only its fences live on (below)
    auto spec = model::parse_job_spec(record.spec_yaml, "job " + std::to_string(record.id));
    if (spec) *spec = element_spec(std::move(*spec));
    if (!spec) {
      spdlog::error("job {} has a spec that no longer parses; it is failed: {}", record.id, spec.error().message());
      record.state = JobState::Failed;
      record.reason = "spec no longer valid after an upgrade";
      record.ended_at = now.wall;
      out_.changes.push_back({{store::UpdateJob{record}, store::AppendEvent{{record.id, now.wall, "-> FAILED: " + record.reason}}}});
      continue;
    }
    Job job{record, *spec, {}, {}, false, {}, {}};
    // The monotonic clock starts over with each process: what ran before is dated by the
    // wall clock, the one time both processes share.
    std::optional<Instant> started;
    if (record.started_at) started = now.instant_of(*record.started_at);
    // A deadline that passed before this process started was judged by the one before
    // (or would be judged now on a partial view): not again.
    if (started && now.mono >= *started + spec->rendezvous_timeout) {
      job.rendezvous.phase = Job::Rendezvous::Phase::Done;
    }
    Result<void> ok;
    if (record.state == JobState::Pending) {
      ok = scheduler_.add_pending(record.id, record.user, *spec, now.instant_of(record.submitted_at), record.attempt);
    } else {
      sched::SchedJob sj;
      sj.id = record.id;
      sj.user = record.user;
      sj.spec = *spec;
      sj.state = record.state;
      sj.attempt = record.attempt;
      sj.submitted_at = now.instant_of(record.submitted_at);
      sj.started_at = started;
      sj.allocation = record.allocation;
      sj.outcome = record.outcome;
      if (record.state == JobState::Ending) {
        const std::set<std::string> let_go = store::released_nodes(record);
        for (const auto& na : record.allocation->nodes) {
          if (let_go.contains(na.node)) sj.released_nodes.insert(na.node);
        }
      }
      ok = scheduler_.restore_active(std::move(sj));
      if (ok && record.state == JobState::Starting) {
        // Its Launch may have gone out before the restart: a rank its agent does not
        // report after Synced never started (see on_synced).
        for (const auto& na : record.allocation->nodes) job.launched_on[na.node] = 0;
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
  for (const auto& record : snapshot.active_jobs) {
    for (const auto& f : record.fences) {
      auto ok = scheduler_.restore_fence({record.id, f.attempt, f.node, f.gpus, f.host, f.port});
      if (!ok) spdlog::error("job {}: fence on {} could not be restored: {}", record.id, f.node, ok.error().message());
    }
    if (model::is_terminal(record.state) && record.fenced()) {
      auto spec = model::parse_job_spec(record.spec_yaml, "job " + std::to_string(record.id));
      if (spec) *spec = element_spec(std::move(*spec));
      fenced_.insert_or_assign(record.id, Job{record, spec ? *spec : model::JobSpec{}, {}, {}, false, {}, {}});
    }
  }
  // Dependencies, once every live job is known: on a live job they wait, on an ended one
  // they are settled now.
  std::vector<model::JobId> pending;
  for (const auto& [id, job] : jobs_) {
    if (job.record.state == JobState::Pending && !job.spec.dependencies.empty()) pending.push_back(id);
  }
  std::sort(pending.begin(), pending.end());
  for (model::JobId id : pending) {
    if (Job* job = live(id)) watch_dependencies(*job, ended);
  }
  for (const auto& [id, job] : jobs_) {
    if (!job.record.array) continue;
    ArrayInfo& info = arrays_[job.record.array->job];
    info.live.insert(id);
    if (job.spec.array) info.max_running = job.spec.array->max_running;
  }
  for (const auto& [array, info] : arrays_) arrays_dirty_.insert(array);
  // Every node is down until its agent says hello; the jobs on them stay as they are
  // through the grace period (set_node_state would lose them now).
  in_grace_ = running > 0;  // STARTING, RUNNING and ENDING jobs
  grace_ends_ = now.mono + config_.reconnect_grace;
  if (in_grace_) {
    spdlog::info("restarted with {} running job(s); waiting up to {} for their agents", running,
                 format_duration(config_.reconnect_grace));
  } else {
    for (const auto* node : scheduler_.nodes()) {
      if (node->state == model::NodeState::Up) {
        (void)scheduler_.set_node_state(node->name, model::NodeState::Down, "waiting for the agent", now.mono);
      }
    }
  }
  out_.pass_wanted = true;
  return {};
}

}  // namespace corral::ledger
