#include "coordinator/sched/scheduler.hpp"

#include <algorithm>
#include <limits>
#include <set>

#include "common/core/check.hpp"
#include "common/core/strings.hpp"

namespace corral::sched {

using model::JobState;

Scheduler::Scheduler(SchedOptions options) : options_(options), fair_share_(options.fair_share_half_life) {}

// ---------------------------------------------------------------- cluster

int Scheduler::class_id(const model::Gpu& gpu) {
  auto it = class_index_.find(gpu.cls);
  if (it != class_index_.end()) {
    // The driver decides the CUDA version; keep the highest reported for the class.
    auto& info = classes_[static_cast<std::size_t>(it->second)];
    info.cuda = std::max(info.cuda, gpu.cuda);
    return it->second;
  }
  int id = static_cast<int>(classes_.size());
  classes_.push_back({gpu.cls, gpu.cuda});
  class_index_.emplace(gpu.cls, id);
  class_cache_.clear();
  return id;
}

Result<std::vector<Decision>> Scheduler::update_node(const model::Node& node, Instant now) {
  if (node.name.empty()) return make_error(ErrorCode::InvalidArgument, "node name is empty");
  if (node.gpus.size() > static_cast<std::size_t>(kMaxGpusPerNode)) {
    return make_error(ErrorCode::InvalidArgument, "node " + node.name + " reports " +
                                                      std::to_string(node.gpus.size()) + " GPUs; at most " +
                                                      std::to_string(kMaxGpusPerNode) + " are supported");
  }
  if (node.ports.first < 1 || node.ports.last > 65535 || node.ports.first > node.ports.last) {
    return make_error(ErrorCode::InvalidArgument, "node " + node.name + " has an invalid port range " +
                                                      std::to_string(node.ports.first) + "-" +
                                                      std::to_string(node.ports.last));
  }
  std::unordered_map<int, int> position;
  for (std::size_t p = 0; p < node.gpus.size(); ++p) {
    if (!position.emplace(node.gpus[p].index, static_cast<int>(p)).second) {
      return make_error(ErrorCode::InvalidArgument, "node " + node.name + " reports GPU index " +
                                                        std::to_string(node.gpus[p].index) + " twice");
    }
  }

  auto [it, inserted] = node_index_.emplace(node.name, static_cast<int>(nodes_.size()));
  if (inserted) {
    nodes_.emplace_back();
  }
  NodeSlot& slot = nodes_[static_cast<std::size_t>(it->second)];
  model::NodeState old_state = inserted ? model::NodeState::Down : slot.node.state;
  std::unordered_map<int, model::JobId> old_holders;
  for (const auto& [index, pos] : slot.position) {
    if (slot.holder[static_cast<std::size_t>(pos)] != 0) old_holders[index] = slot.holder[static_cast<std::size_t>(pos)];
  }

  slot.node = node;
  slot.position = std::move(position);
  slot.holder.assign(node.gpus.size(), 0);
  slot.layout.gpu_class.assign(node.gpus.size(), 0);
  slot.layout.nvlink.assign(node.gpus.size(), 0);
  for (std::size_t p = 0; p < node.gpus.size(); ++p) {
    const auto& gpu = node.gpus[p];
    slot.layout.gpu_class[p] = class_id(gpu);
    for (int peer : gpu.nvlink_peers) {
      auto peer_pos = slot.position.find(peer);
      if (peer_pos != slot.position.end() && peer_pos->second != static_cast<int>(p)) {
        slot.layout.nvlink[p] |= GpuMask{1} << peer_pos->second;
      }
    }
    auto held = old_holders.find(gpu.index);
    if (held != old_holders.end()) slot.holder[p] = held->second;
  }
  max_gpus_per_node_ = std::max(max_gpus_per_node_, static_cast<int>(node.gpus.size()));
  layouts_.resize(nodes_.size());
  layouts_[static_cast<std::size_t>(it->second)] = slot.layout;

  std::vector<Decision> decisions;
  if (node.state == model::NodeState::Down && old_state != model::NodeState::Down) {
    decisions = lose_node(node.name, node.reason, now);
  }
  return decisions;
}

Result<std::vector<Decision>> Scheduler::set_node_state(std::string_view name, model::NodeState state,
                                                        std::string reason, Instant now) {
  auto it = node_index_.find(std::string(name));
  if (it == node_index_.end()) return make_error(ErrorCode::NotFound, "no node named " + std::string(name));
  model::Node node = nodes_[static_cast<std::size_t>(it->second)].node;
  node.state = state;
  node.reason = std::move(reason);
  return update_node(node, now);
}

std::vector<Decision> Scheduler::lose_node(const std::string& name, const std::string& reason, Instant now) {
  std::vector<model::JobId> lost;
  for (const auto& [id, job] : jobs_) {
    // An ENDING job's outcome is decided; its ranks there stay unconfirmed (fenced).
    if (!job.allocation || job.state == JobState::Ending) continue;
    for (const auto& na : job.allocation->nodes) {
      if (na.node == name) {
        lost.push_back(id);
        break;
      }
    }
  }
  std::sort(lost.begin(), lost.end());
  std::vector<Decision> decisions;
  for (model::JobId id : lost) {
    EventInfo info;
    info.node = name;
    info.message = reason.empty() ? "node " + name + " lost" : "node " + name + " lost: " + reason;
    auto more = on_event(id, jobs_.at(id).attempt, JobEvent::NodeLost, now, info);
    CORRAL_CHECK(more.has_value());
    decisions.insert(decisions.end(), more->begin(), more->end());
  }
  return decisions;
}

Result<void> Scheduler::set_reachable(std::string_view name, bool reachable) {
  auto it = node_index_.find(std::string(name));
  if (it == node_index_.end()) return make_error(ErrorCode::NotFound, "no node named " + std::string(name));
  nodes_[static_cast<std::size_t>(it->second)].reachable = reachable;
  return {};
}

bool Scheduler::reachable(std::string_view name) const {
  auto it = node_index_.find(std::string(name));
  return it != node_index_.end() && nodes_[static_cast<std::size_t>(it->second)].reachable;
}

const model::Node* Scheduler::node(std::string_view name) const {
  auto it = node_index_.find(std::string(name));
  return it == node_index_.end() ? nullptr : &nodes_[static_cast<std::size_t>(it->second)].node;
}

std::vector<const model::Node*> Scheduler::nodes() const {
  std::vector<const model::Node*> out;
  out.reserve(nodes_.size());
  for (const auto& slot : nodes_) out.push_back(&slot.node);
  std::sort(out.begin(), out.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  return out;
}

std::optional<model::JobId> Scheduler::gpu_holder(std::string_view name, int gpu_index) const {
  auto it = node_index_.find(std::string(name));
  if (it == node_index_.end()) return std::nullopt;
  const NodeSlot& slot = nodes_[static_cast<std::size_t>(it->second)];
  auto pos = slot.position.find(gpu_index);
  if (pos == slot.position.end()) return std::nullopt;
  model::JobId holder = slot.holder[static_cast<std::size_t>(pos->second)];
  if (holder == 0) return std::nullopt;
  return holder;
}

std::optional<model::JobId> Scheduler::port_holder(std::string_view host, int port) const {
  return ports_.holder(host, port);
}

// ---------------------------------------------------------------- jobs

std::vector<int> Scheduler::matching_classes(const model::GpuConstraint& c) const {
  std::vector<int> out;
  for (std::size_t i = 0; i < classes_.size(); ++i) {
    const auto& info = classes_[i];
    if (!c.model.empty() && !glob_match(c.model, info.cls.product)) continue;
    if (c.min_memory_mib && info.cls.memory_mib < *c.min_memory_mib) continue;
    if (c.min_cuda && info.cuda < *c.min_cuda) continue;
    out.push_back(static_cast<int>(i));
  }
  return out;
}

const std::vector<int>& Scheduler::matching_classes(const SchedJob& job) const {
  auto it = class_cache_.find(job.id);
  if (it == class_cache_.end()) it = class_cache_.emplace(job.id, matching_classes(job.spec.gpu)).first;
  return it->second;
}

namespace {

std::string shape_text(const model::JobSpec& spec) {
  if (spec.nodes && spec.gpus_per_node && *spec.nodes > 1) {
    return std::to_string(*spec.nodes) + " nodes × " + std::to_string(*spec.gpus_per_node) + " GPUs";
  }
  return std::to_string(model::total_gpus(spec)) + " GPUs";
}

}  // namespace

Result<void> Scheduler::admissible(const model::JobSpec& spec) const {
  if (nodes_.empty()) return {};  // nothing known yet: the job waits for nodes to join
  auto classes = matching_classes(spec.gpu);
  if (classes.empty()) {
    return make_error(ErrorCode::ResourceExhausted,
                      "no GPU in the cluster matches resources.gpu; the cluster has " +
                          std::to_string(classes_.size()) + " GPU class(es), e.g. " +
                          classes_.front().cls.to_string() + " (CUDA " + classes_.front().cuda.to_string() + ")");
  }
  Capacity all = build(View::IdleAll);
  auto shapes = model::candidate_shapes(spec);
  if (fits(shapes, classes, all)) return {};
  // Say what the largest gang of one class looks like, to make the mismatch obvious.
  int best_cls = classes.front();
  int best_per_node = 0;
  for (int cls : classes) {
    for (int k = all.max_count(); k > 0; --k) {
      if (all.nodes_with_at_least(cls, k) > 0) {
        if (k > best_per_node) {
          best_per_node = k;
          best_cls = cls;
        }
        break;
      }
    }
  }
  const auto& info = classes_[static_cast<std::size_t>(best_cls)];
  std::string msg = "no node set in the cluster could ever run this job: it asks for " + shape_text(spec) +
                    " of one GPU class";
  if (!shapes.empty()) {
    int per_node = shapes.front().second;
    int n = shapes.front().first;
    if (best_per_node < per_node) {
      msg += "; the most any node has is " + std::to_string(best_per_node) + " × " + info.cls.product;
    } else {
      msg += "; only " + std::to_string(all.nodes_with_at_least(best_cls, per_node)) + " node(s) have " +
             std::to_string(per_node) + " × " + info.cls.product + ", " + std::to_string(n) + " needed";
    }
  }
  return make_error(ErrorCode::ResourceExhausted, msg);
}

Result<void> Scheduler::add_pending(model::JobId id, std::string user, model::JobSpec spec, Instant submitted_at,
                                    int attempt) {
  if (id <= 0) return make_error(ErrorCode::InvalidArgument, "job id must be positive");
  if (jobs_.contains(id)) return make_error(ErrorCode::Conflict, "job " + std::to_string(id) + " exists");
  if (model::candidate_shapes(spec).empty()) {
    return make_error(ErrorCode::InvalidArgument, "job " + std::to_string(id) + " asks for no valid GPU shape");
  }
  SchedJob job;
  job.id = id;
  job.user = std::move(user);
  job.spec = std::move(spec);
  job.state = JobState::Pending;
  job.attempt = attempt;
  job.submitted_at = submitted_at;
  job.shapes = model::candidate_shapes(job.spec);
  job.reason = {PendingCode::Resources, "not yet considered"};
  jobs_.emplace(id, std::move(job));
  return {};
}

Result<void> Scheduler::restore_active(SchedJob job) {
  if (!model::holds_resources(job.state) || !job.allocation) {
    return make_error(ErrorCode::InvalidArgument,
                      "job " + std::to_string(job.id) + " is not STARTING, RUNNING or ENDING with an allocation");
  }
  if ((job.state == JobState::Ending) != job.outcome.has_value()) {
    return make_error(ErrorCode::InvalidArgument, "job " + std::to_string(job.id) + " is " +
                                                      std::string(model::to_string(job.state)) +
                                                      (job.outcome ? " with" : " without") + " an outcome");
  }
  if (job.state != JobState::Ending) job.released_nodes.clear();
  if (jobs_.contains(job.id)) return make_error(ErrorCode::Conflict, "job " + std::to_string(job.id) + " exists");
  const auto& alloc = *job.allocation;
  if (alloc.nodes.empty()) return make_error(ErrorCode::InvalidArgument, "job " + std::to_string(job.id) + " has an empty allocation");
  for (const auto& na : alloc.nodes) {
    if (job.released(na.node)) continue;  // its GPUs may serve another job by now
    auto it = node_index_.find(na.node);
    if (it == node_index_.end()) {
      return make_error(ErrorCode::NotFound, "job " + std::to_string(job.id) + " runs on unknown node " + na.node);
    }
    const NodeSlot& slot = nodes_[static_cast<std::size_t>(it->second)];
    for (int g : na.gpus) {
      auto pos = slot.position.find(g);
      if (pos == slot.position.end()) {
        return make_error(ErrorCode::NotFound, "job " + std::to_string(job.id) + " holds GPU " + std::to_string(g) +
                                                   " that node " + na.node + " does not have");
      }
      if (slot.holder[static_cast<std::size_t>(pos->second)] != 0) {
        return make_error(ErrorCode::Conflict, "GPU " + std::to_string(g) + " of " + na.node + " is already held by job " +
                                                   std::to_string(slot.holder[static_cast<std::size_t>(pos->second)]));
      }
    }
  }
  auto holder = ports_.holder(alloc.master_addr, alloc.master_port);
  if (holder && *holder != job.id) {  // the job's own fences may hold it already
    return make_error(ErrorCode::Conflict, "port " + std::to_string(alloc.master_port) + " on " + alloc.master_addr +
                                               " is already held by job " + std::to_string(*holder));
  }
  model::Allocation copy = alloc;
  job.shapes = model::candidate_shapes(job.spec);
  auto [it, _] = jobs_.emplace(job.id, std::move(job));
  hold(it->second, copy, it->second.started_at.value_or(Instant{}));
  return {};
}

Result<SchedJob*> Scheduler::ending_job(model::JobId id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return make_error(ErrorCode::NotFound, "no live job " + std::to_string(id));
  if (it->second.state != JobState::Ending || !it->second.allocation) {
    return make_error(ErrorCode::Conflict, "job " + std::to_string(id) + " is not ENDING");
  }
  return &it->second;
}

Result<Fence> Scheduler::fence_node(model::JobId id, std::string_view node, Instant now) {
  auto found = ending_job(id);
  if (!found) return std::unexpected(found.error());
  SchedJob& job = **found;
  const auto& alloc = *job.allocation;
  auto na = std::find_if(alloc.nodes.begin(), alloc.nodes.end(), [&](const auto& n) { return n.node == node; });
  if (na == alloc.nodes.end()) {
    return make_error(ErrorCode::NotFound, "job " + std::to_string(id) + " has no GPU on " + std::string(node));
  }
  if (job.released(node)) {
    return make_error(ErrorCode::Conflict, "job " + std::to_string(id) + " no longer holds " + std::string(node));
  }
  // The GPUs' holders stay as they are: they pass from the job to its fence. The fence
  // holds the master port too, wherever the node is: its ranks may still connect to it.
  Fence fence{id, job.attempt, na->node, na->gpus, alloc.master_addr, alloc.master_port};
  CORRAL_CHECK(ports_.hold(fence.host, fence.port, id));
  fair_share_.advance(now, gpus_by_user_);
  job.released_nodes.insert(na->node);
  auto user = gpus_by_user_.find(job.user);
  if (user != gpus_by_user_.end()) {
    user->second -= static_cast<int>(na->gpus.size());
    if (user->second <= 0) gpus_by_user_.erase(user);
  }
  fences_.push_back(fence);
  return fence;
}

Result<void> Scheduler::restore_fence(const Fence& fence) {
  auto it = node_index_.find(fence.node);
  if (it == node_index_.end()) return make_error(ErrorCode::NotFound, "fence on unknown node " + fence.node);
  NodeSlot& slot = nodes_[static_cast<std::size_t>(it->second)];
  for (int g : fence.gpus) {
    auto pos = slot.position.find(g);
    if (pos == slot.position.end()) return make_error(ErrorCode::NotFound, "fence on unknown GPU " + std::to_string(g));
    if (slot.holder[static_cast<std::size_t>(pos->second)] != 0) {
      return make_error(ErrorCode::Conflict, "fenced GPU " + std::to_string(g) + " of " + fence.node + " is held");
    }
  }
  if (fence.port != 0 && !ports_.hold(fence.host, fence.port, fence.job)) {
    return make_error(ErrorCode::Conflict, "fenced port " + std::to_string(fence.port) + " is held");
  }
  for (int g : fence.gpus) slot.holder[static_cast<std::size_t>(slot.position.at(g))] = fence.job;
  fences_.push_back(fence);
  return {};
}

bool Scheduler::lift_fence(model::JobId job, int attempt, std::string_view node) {
  auto f = std::find_if(fences_.begin(), fences_.end(),
                        [&](const Fence& x) { return x.job == job && x.attempt == attempt && x.node == node; });
  if (f == fences_.end()) return false;
  auto it = node_index_.find(f->node);
  if (it != node_index_.end()) {
    NodeSlot& slot = nodes_[static_cast<std::size_t>(it->second)];
    for (int g : f->gpus) {
      auto pos = slot.position.find(g);
      if (pos == slot.position.end()) continue;
      auto& holder = slot.holder[static_cast<std::size_t>(pos->second)];
      if (holder == job) holder = 0;
    }
  }
  if (f->port != 0) ports_.release(f->host, f->port, job);
  fences_.erase(f);
  return true;
}

const SchedJob* Scheduler::job(model::JobId id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Result<std::vector<Decision>> Scheduler::on_event(model::JobId id, int attempt, JobEvent event, Instant now,
                                                  const EventInfo& info) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return make_error(ErrorCode::NotFound, "no live job " + std::to_string(id));
  SchedJob& job = it->second;
  if (attempt != job.attempt) {
    return make_error(ErrorCode::Conflict, "job " + std::to_string(id) + " is at attempt " +
                                               std::to_string(job.attempt) + ", not " + std::to_string(attempt));
  }
  if (event == JobEvent::Schedule) {
    return make_error(ErrorCode::InvalidArgument, "only a scheduling pass places jobs");
  }
  bool retry_left = job.attempt < job.spec.retries;
  auto t = next_state(job.state, event, retry_left, job.outcome);
  if (!t) return std::unexpected(t.error().with_context("job " + std::to_string(id)));
  if (event == JobEvent::PortBusy && job.allocation) {
    ports_.mark_busy(job.allocation->master_addr, job.allocation->master_port, now + options_.busy_port_hold);
  }
  return apply(job, *t, event, now, info);
}

void Scheduler::hold(SchedJob& job, const model::Allocation& alloc, Instant now) {
  // Account the GPU time used so far before the held count changes.
  fair_share_.advance(now, gpus_by_user_);
  int count = 0;
  for (const auto& na : alloc.nodes) {
    if (job.released(na.node)) continue;  // a restored ENDING job: confirmed there already
    NodeSlot& slot = nodes_[static_cast<std::size_t>(node_index_.at(na.node))];
    for (int g : na.gpus) {
      auto& holder = slot.holder[static_cast<std::size_t>(slot.position.at(g))];
      CORRAL_CHECK(holder == 0);
      holder = job.id;
      ++count;
    }
  }
  CORRAL_CHECK(ports_.hold(alloc.master_addr, alloc.master_port, job.id));
  gpus_by_user_[job.user] += count;
  job.allocation = alloc;
}

int Scheduler::release_on(SchedJob& job, const std::string& node) {
  if (!job.allocation) return 0;
  if (job.released(node)) return 0;
  job.released_nodes.insert(node);
  int count = 0;
  for (const auto& na : job.allocation->nodes) {
    if (na.node != node) continue;
    auto it = node_index_.find(na.node);
    if (it == node_index_.end()) continue;
    NodeSlot& slot = nodes_[static_cast<std::size_t>(it->second)];
    for (int g : na.gpus) {
      auto pos = slot.position.find(g);
      if (pos == slot.position.end()) continue;
      auto& holder = slot.holder[static_cast<std::size_t>(pos->second)];
      if (holder == job.id) holder = 0;
      ++count;
    }
  }
  auto user = gpus_by_user_.find(job.user);
  if (user != gpus_by_user_.end()) {
    user->second -= count;
    if (user->second <= 0) gpus_by_user_.erase(user);
  }
  return count;
}

void Scheduler::release(SchedJob& job, Instant now) {
  if (!job.allocation) return;
  fair_share_.advance(now, gpus_by_user_);
  for (const auto& na : job.allocation->nodes) release_on(job, na.node);
  // The port last: ranks on any node may connect to it until all are gone.
  ports_.release(job.allocation->master_addr, job.allocation->master_port, job.id);
  job.allocation.reset();
  job.released_nodes.clear();
}

Result<void> Scheduler::release_node(model::JobId id, std::string_view node, Instant now) {
  auto found = ending_job(id);
  if (!found) return std::unexpected(found.error());
  SchedJob& job = **found;
  bool runs_there = std::any_of(job.allocation->nodes.begin(), job.allocation->nodes.end(),
                                [&](const auto& na) { return na.node == node; });
  if (!runs_there) return make_error(ErrorCode::NotFound, "job " + std::to_string(id) + " has no GPU on " + std::string(node));
  fair_share_.advance(now, gpus_by_user_);
  release_on(job, std::string(node));
  return {};
}

std::string Scheduler::describe(const SchedJob& job, const JobChange& change) const {
  std::string text = std::string(model::to_string(change.from)) + " -> " + std::string(model::to_string(change.to));
  if (change.to == JobState::Starting && change.allocation) {
    text += " on ";
    bool first = true;
    for (const auto& na : change.allocation->nodes) {
      if (!first) text += ",";
      first = false;
      text += na.node + "[";
      for (std::size_t i = 0; i < na.gpus.size(); ++i) text += (i ? "," : "") + std::to_string(na.gpus[i]);
      text += "]";
    }
    text += " master " + change.allocation->master_addr + ":" + std::to_string(change.allocation->master_port);
  }
  if (change.to == JobState::Ending && change.outcome) {
    std::string then = *change.outcome == JobState::Pending ? "requeued" : std::string(model::to_string(*change.outcome));
    text += " (" + then + " once every rank is gone)";
  }
  if (change.to == JobState::Pending && change.from != JobState::Pending) {
    text += " (attempt " + std::to_string(job.attempt) + ")";
  }
  const auto& info = change.info;
  std::string exited;
  if (info.exit_code) exited = "exited with code " + std::to_string(*info.exit_code);
  if (info.rank) {
    text += ": rank " + std::to_string(*info.rank);
    if (!info.node.empty()) text += " on " + info.node;
    if (!exited.empty()) text += " " + exited;
  }
  // The agent's own words, unless they only say the exit code again.
  if (!info.message.empty() && info.message != exited) text += (info.rank ? "; " : ": ") + info.message;
  if (change.event == JobEvent::TimeLimit && job.spec.time_limit) {
    text += ": time limit " + format_duration(*job.spec.time_limit) + " reached";
  }
  return text;
}

std::vector<Decision> Scheduler::apply(SchedJob& job, const Transition& t, JobEvent event, Instant now,
                                       const EventInfo& info) {
  JobChange change;
  change.job = job.id;
  change.from = job.state;
  change.to = t.to;
  change.event = event;
  change.info = info;
  change.outcome = t.outcome;
  std::optional<KillRanks> kill;
  if (t.to == JobState::Ending) {
    // The outcome is decided; the GPUs and port stay held until the agents confirm that
    // nothing of the attempt is left. Every rank has exited by itself: the agents confirm
    // on their own. Otherwise the whole gang goes, except on a lost node nobody can reach;
    // its agent is told when it comes back.
    if (event != JobEvent::AllRanksExitedOk && job.allocation) {
      KillRanks k{job.id, job.attempt, {}};
      for (const auto& na : job.allocation->nodes) {
        if (event == JobEvent::NodeLost && na.node == info.node) continue;
        k.nodes.push_back(na.node);
      }
      if (!k.nodes.empty()) kill = std::move(k);
    }
  } else if (model::holds_resources(job.state) && !model::holds_resources(t.to)) {
    // RanksGone, or PortBusy (answers PREPARE, before any LAUNCH): nothing runs.
    change.allocation = job.allocation;
    release(job, now);
  }
  if (t.to == JobState::Pending || model::is_terminal(t.to)) change.started = job.started_at;
  if (t.new_attempt) ++job.attempt;
  job.state = t.to;
  job.outcome = t.outcome;
  if (t.to == JobState::Pending) {
    job.started_at.reset();
    job.reason = {PendingCode::Resources, "requeued"};
  }
  change.attempt = job.attempt;
  change.text = describe(job, change);
  std::vector<Decision> out;
  out.emplace_back(std::move(change));
  if (kill) out.emplace_back(std::move(*kill));
  if (model::is_terminal(t.to)) {
    class_cache_.erase(job.id);
    jobs_.erase(job.id);  // `job` dangles from here on
  }
  return out;
}

// ---------------------------------------------------------------- placement

Capacity Scheduler::build(View view) const {
  Capacity cap(static_cast<int>(nodes_.size()), static_cast<int>(classes_.size()), max_gpus_per_node_);
  std::vector<std::pair<int, GpuMask>> masks;  // per class present on the node
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const NodeSlot& slot = nodes_[i];
    auto state = slot.node.state;
    bool include = (slot.reachable && (state == model::NodeState::Up ||
                                       (view == View::IdleUpOrDrained && state == model::NodeState::Drained))) ||
                   view == View::IdleAll;
    if (!include) continue;
    masks.clear();
    for (std::size_t p = 0; p < slot.holder.size(); ++p) {
      if (view == View::Free && slot.holder[p] != 0) continue;
      int cls = slot.layout.gpu_class[p];
      auto it = std::find_if(masks.begin(), masks.end(), [cls](const auto& m) { return m.first == cls; });
      if (it == masks.end()) it = masks.insert(masks.end(), {cls, 0});
      it->second |= GpuMask{1} << p;
    }
    for (const auto& [cls, mask] : masks) cap.set_free(static_cast<int>(i), cls, mask);
  }
  return cap;
}

Result<void> Scheduler::set_held(model::JobId id, std::optional<PendingReason> reason) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state != JobState::Pending) {
    return make_error(ErrorCode::NotFound, "job " + std::to_string(id) + " is not pending");
  }
  it->second.held = std::move(reason);
  if (it->second.held) it->second.reason = *it->second.held;
  return {};
}

bool Scheduler::might_start_now(model::JobId id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state != JobState::Pending) return false;
  SchedJob& job = it->second;
  if (job.held) return false;
  const auto& classes = matching_classes(job);
  Capacity avail = build(View::Free);
  if (fits(job.shapes, classes, avail)) return true;
  std::vector<std::optional<Capacity>> views(4);
  job.reason = diagnose(job.spec, job.shapes, classes, avail, views);
  return false;
}

bool Scheduler::fits(const std::vector<std::pair<int, int>>& shapes, const std::vector<int>& classes,
                     const Capacity& cap) const {
  for (auto [n, g] : shapes) {
    for (int cls : classes) {
      if (cap.nodes_with_at_least(cls, g) >= n) return true;
    }
  }
  return false;
}

std::optional<Placement> Scheduler::place(const std::vector<std::pair<int, int>>& shapes,
                                          const std::vector<int>& classes, const Capacity& cap) const {
  for (auto [n, g] : shapes) {
    std::optional<Placement> best;
    int best_left = 0;
    for (int cls : classes) {
      if (cap.nodes_with_at_least(cls, g) < n) continue;
      auto p = place_in_class(cap, layouts_, cls, n, g);
      if (!p) continue;
      int left = leftover(cap, *p);
      if (!best || left < best_left) {
        best = std::move(p);
        best_left = left;
      }
    }
    if (best) return best;
  }
  return std::nullopt;
}

std::optional<model::Allocation> Scheduler::with_port(const Placement& placement, Instant now) const {
  for (std::size_t master = 0; master < placement.nodes.size(); ++master) {
    const NodeSlot& m = nodes_[static_cast<std::size_t>(placement.nodes[master].node)];
    auto port = ports_.lowest_free(m.node.address, m.node.ports, now);
    if (!port) continue;
    model::Allocation alloc;
    alloc.master_addr = m.node.address;
    alloc.master_port = *port;
    // The master node goes first: it hosts rank 0.
    std::vector<std::size_t> order{master};
    for (std::size_t i = 0; i < placement.nodes.size(); ++i) {
      if (i != master) order.push_back(i);
    }
    for (std::size_t i : order) {
      const auto& pn = placement.nodes[i];
      const NodeSlot& slot = nodes_[static_cast<std::size_t>(pn.node)];
      model::NodeAllocation na;
      na.node = slot.node.name;
      for (GpuMask mask = pn.gpus; mask != 0; mask &= mask - 1) {
        na.gpus.push_back(slot.node.gpus[static_cast<std::size_t>(__builtin_ctzll(mask))].index);
      }
      alloc.nodes.push_back(std::move(na));
    }
    return alloc;
  }
  return std::nullopt;
}

std::string Scheduler::largest_free_set(const std::vector<int>& classes, const Capacity& avail) const {
  int best = -1;
  for (int cls : classes) {
    if (best < 0 || avail.free_total(cls) > avail.free_total(best)) best = cls;
  }
  if (best < 0 || avail.free_total(best) == 0) return "none";
  std::string names;
  int listed = 0;
  int more = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (avail.free_count(static_cast<int>(i), best) == 0) continue;
    if (listed < 3) {
      names += (listed ? ", " : "") + nodes_[i].node.name;
      ++listed;
    } else {
      ++more;
    }
  }
  if (more > 0) names += " and " + std::to_string(more) + " more";
  return std::to_string(avail.free_total(best)) + " × " + classes_[static_cast<std::size_t>(best)].cls.product + " on " +
         names;
}

PendingReason Scheduler::diagnose(const model::JobSpec& spec, const std::vector<std::pair<int, int>>& shapes,
                                  const std::vector<int>& classes, const Capacity& avail,
                                  std::vector<std::optional<Capacity>>& views) const {
  if (nodes_.empty()) return {PendingCode::Resources, "no node has joined the cluster"};
  if (classes.empty()) return {PendingCode::NoHomogeneousSet, "no GPU in the cluster matches resources.gpu"};
  auto fits_in = [&](View v) {
    auto& cap = views[static_cast<std::size_t>(v)];
    if (!cap) cap = build(v);
    return fits(shapes, classes, *cap);
  };
  int need = model::total_gpus(spec);
  if (fits_in(View::IdleUp)) {
    int free_matching = 0;
    for (int cls : classes) free_matching += avail.free_total(cls);
    if (free_matching >= need) {
      return {PendingCode::NoHomogeneousSet,
              "no homogeneous set of " + shape_text(spec) + ": largest free set is " + largest_free_set(classes, avail)};
    }
    return {PendingCode::Resources, std::to_string(need) + " GPUs of one class needed, " +
                                        std::to_string(free_matching) + " matching GPUs free"};
  }
  auto nodes_in = [&](model::NodeState state) {
    std::string names;
    for (const auto& slot : nodes_) {
      bool down = slot.node.state == model::NodeState::Down || !slot.reachable;
      bool match = state == model::NodeState::Down ? down : (slot.node.state == state && !down);
      if (!match) continue;
      names += (names.empty() ? "" : ", ") + slot.node.name;
      if (down && slot.node.state != model::NodeState::Down) names += " (agent not connected)";
    }
    return names;
  };
  if (fits_in(View::IdleUpOrDrained)) {
    return {PendingCode::Drained, "fits only with drained nodes: " + nodes_in(model::NodeState::Drained)};
  }
  if (fits_in(View::IdleAll)) {
    return {PendingCode::NodeDown, "fits only when down nodes return: " + nodes_in(model::NodeState::Down)};
  }
  return {PendingCode::NoHomogeneousSet,
          "no homogeneous set of " + shape_text(spec) + ": largest free set is " + largest_free_set(classes, avail)};
}

DryRun Scheduler::dry_run(const model::JobSpec& spec, const std::string& user, Instant now) const {
  (void)user;
  DryRun out;
  auto classes = matching_classes(spec.gpu);
  auto shapes = model::candidate_shapes(spec);
  Capacity avail = build(View::Free);
  if (auto p = place(shapes, classes, avail)) {
    out.allocation = with_port(*p, now);
    if (out.allocation) return out;
    out.reason = {PendingCode::Resources, "no free master port on the chosen nodes"};
    return out;
  }
  std::vector<std::optional<Capacity>> views(4);
  out.reason = diagnose(spec, shapes, classes, avail, views);
  return out;
}

std::vector<Decision> Scheduler::schedule(Instant now) {
  last_pass_ = {};
  std::vector<Decision> decisions;
  fair_share_.advance(now, gpus_by_user_);

  // Time limits first, so their GPUs are free for this pass.
  std::vector<model::JobId> expired;
  for (const auto& [id, job] : jobs_) {
    if ((job.state == JobState::Starting || job.state == JobState::Running) && job.spec.time_limit && job.started_at &&
        now >= *job.started_at + *job.spec.time_limit) {
      expired.push_back(id);
    }
  }
  std::sort(expired.begin(), expired.end());
  for (model::JobId id : expired) {
    auto more = on_event(id, jobs_.at(id).attempt, JobEvent::TimeLimit, now);
    CORRAL_CHECK(more.has_value());
    decisions.insert(decisions.end(), more->begin(), more->end());
  }

  struct Entry {
    int priority;
    double usage;
    model::JobId id;  // ids are given in submission order: the oldest first
    SchedJob* job;
  };
  std::vector<Entry> queue;
  for (auto& [id, job] : jobs_) {
    if (job.state == JobState::Pending && !job.held) {
      queue.push_back({job.spec.priority, fair_share_.usage(job.user), id, &job});
    }
  }
  std::sort(queue.begin(), queue.end(), [](const Entry& a, const Entry& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.usage != b.usage) return a.usage < b.usage;
    return a.id < b.id;
  });

  Capacity avail = build(View::Free);
  std::vector<std::optional<Capacity>> views(4);
  const SchedJob* head = nullptr;
  std::optional<Capacity> unreserved;  // free GPUs minus the head's reservation
  std::optional<Instant> shadow;     // when the head can start, if known
  std::map<std::vector<int>, PendingReason> reasons;  // behind the head, by (classes, shapes)

  auto start = [&](SchedJob& job, const Placement& p, const model::Allocation& alloc) {
    avail.take(p);
    if (unreserved) unreserved->take(p);
    hold(job, alloc, now);
    job.started_at = now;
    job.reason = {};
    auto t = next_state(job.state, JobEvent::Schedule, false);
    CORRAL_CHECK(t.has_value());
    JobChange change;
    change.job = job.id;
    change.from = job.state;
    change.to = t->to;
    change.event = JobEvent::Schedule;
    change.attempt = job.attempt;
    change.allocation = alloc;
    job.state = t->to;
    change.text = describe(job, change);
    decisions.emplace_back(std::move(change));
    ++last_pass_.started;
  };

  for (Entry& entry : queue) {
    SchedJob& job = *entry.job;
    ++last_pass_.considered;
    const auto& classes = matching_classes(job);
    if (head == nullptr) {
      auto p = place(job.shapes, classes, avail);
      std::optional<model::Allocation> alloc;
      if (p) alloc = with_port(*p, now);
      if (alloc) {
        start(job, *p, *alloc);
        continue;
      }
      job.reason = p ? PendingReason{PendingCode::Resources, "no free master port on the chosen nodes"}
                     : diagnose(job.spec, job.shapes, classes, avail, views);
      head = &job;
      if (options_.backfill) {
        reserve(job, classes, avail, now, unreserved, shadow);
      }
      continue;
    }
    if (!options_.backfill) {
      job.reason = {PendingCode::Priority, "waiting behind job " + std::to_string(head->id)};
      continue;
    }
    std::optional<Placement> p = place(job.shapes, classes, unreserved ? *unreserved : avail);
    if (!p && unreserved && shadow && job.spec.time_limit && now + *job.spec.time_limit <= *shadow) {
      // Short enough to end before the head's reserved GPUs are needed.
      p = place(job.shapes, classes, avail);
    }
    std::optional<model::Allocation> alloc;
    if (p) alloc = with_port(*p, now);
    if (alloc) {
      start(job, *p, *alloc);
      ++last_pass_.backfilled;
      continue;
    }
    if (p) {
      job.reason = {PendingCode::Resources, "no free master port on the chosen nodes"};
    } else if (fits(job.shapes, classes, avail)) {
      job.reason = {PendingCode::Priority, "would delay job " + std::to_string(head->id) + ", which waits for these GPUs"};
    } else {
      // Jobs of one shape and class get one reason per pass: diagnosing is the costly
      // part of a pass over a long queue.
      std::vector<int> key(classes);
      key.push_back(-1);
      for (auto [n, g] : job.shapes) {
        key.push_back(n);
        key.push_back(g);
      }
      auto cached = reasons.find(key);
      if (cached == reasons.end()) {
        PendingReason own = diagnose(job.spec, job.shapes, classes, avail, views);
        if (own.code == PendingCode::Resources) {
          // It would fit on an idle cluster: the queue ahead of it is what it waits for.
          own = {PendingCode::Priority, "waiting behind job " + std::to_string(head->id) + "; " + own.detail};
        }
        cached = reasons.emplace(std::move(key), std::move(own)).first;
      }
      job.reason = cached->second;
    }
  }
  return decisions;
}

void Scheduler::reserve(const SchedJob& head, const std::vector<int>& classes, const Capacity& avail, Instant now,
                        std::optional<Capacity>& unreserved, std::optional<Instant>& shadow) const {
  // Release running jobs in the order they must end by, until the head fits: that is its
  // earliest start (the shadow time) and the GPUs it would take then are reserved.
  struct Ending {
    Instant at;
    bool known;
    const SchedJob* job;
  };
  std::vector<Ending> endings;
  for (const auto& [id, job] : jobs_) {
    if (!job.allocation) continue;
    if (job.state == JobState::Ending) {
      endings.push_back({now, true, &job});  // its ranks are being stopped
    } else if (job.spec.time_limit && job.started_at) {
      endings.push_back({*job.started_at + *job.spec.time_limit, true, &job});
    } else {
      endings.push_back({Instant::max(), false, &job});
    }
  }
  std::sort(endings.begin(), endings.end(), [](const Ending& a, const Ending& b) {
    if (a.at != b.at) return a.at < b.at;
    return a.job->id < b.job->id;
  });
  Capacity future = avail;
  std::optional<Placement> at_start;
  bool known = true;
  Instant when = now;
  for (const Ending& e : endings) {
    const auto& alloc = *e.job->allocation;
    for (const auto& na : alloc.nodes) {
      int idx = node_index_.at(na.node);
      const NodeSlot& slot = nodes_[static_cast<std::size_t>(idx)];
      if (slot.node.state != model::NodeState::Up || !slot.reachable) continue;
      if (e.job->released(na.node)) continue;  // free already
      for (int g : na.gpus) {
        int pos = slot.position.at(g);
        future.add_free(idx, slot.layout.gpu_class[static_cast<std::size_t>(pos)], pos);
      }
    }
    if (fits(head.shapes, classes, future)) {
      at_start = place(head.shapes, classes, future);
      known = e.known;
      when = std::max(now, e.at);
      break;
    }
  }
  if (!at_start) return;  // it cannot start even when everything ends: nothing to protect
  unreserved = avail;
  for (const auto& pn : at_start->nodes) {
    for (GpuMask m = pn.gpus; m != 0; m &= m - 1) unreserved->take(pn.node, at_start->cls, __builtin_ctzll(m));
  }
  if (known) shadow = when;
}

}  // namespace corral::sched
