#pragma once
// Scheduler: THE pure core. Cluster state and the queue in, decisions out as values.
// It never sends, sleeps, reads a clock or touches a disk: `now` is a parameter, an
// Instant on the monotonic timeline (time limits, port holds and usage run on it, so a
// wall-clock step moves none of them), and the service layer persists each decision
// before it acts on it. Not thread-safe: the
// coordinator drives it from one strand.

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job.hpp"
#include "common/model/job_spec.hpp"
#include "coordinator/sched/capacity.hpp"
#include "coordinator/sched/fair_share.hpp"
#include "coordinator/sched/options.hpp"
#include "coordinator/sched/pending_reason.hpp"
#include "coordinator/sched/port_book.hpp"
#include "coordinator/sched/state_machine.hpp"

namespace corral::sched {

// A live job as the core tracks it. Terminal jobs leave the core.
struct SchedJob {
  model::JobId id = 0;
  std::string user;
  model::JobSpec spec;
  model::JobState state = model::JobState::Pending;
  int attempt = 0;
  Instant submitted_at{};
  std::optional<Instant> started_at;          // when it last entered STARTING
  std::optional<model::Allocation> allocation;  // while STARTING, RUNNING or ENDING
  std::optional<model::JobState> outcome;      // while ENDING: where it goes when its ranks are gone
  // While ENDING: nodes whose ranks are confirmed gone, or fenced (a set: a gang of a
  // thousand nodes asks for each of them as each confirms).
  std::set<std::string, std::less<>> released_nodes;

  bool released(std::string_view node) const { return released_nodes.contains(node); }
  PendingReason reason;                        // while PENDING
  // While set, the job is not placed and this is its reason (a dependency not met yet).
  std::optional<PendingReason> held;
  std::vector<std::pair<int, int>> shapes;     // candidate (nodes, GPUs per node), fewest nodes first
};

// What happened to a job in an event: who failed and how.
struct EventInfo {
  std::optional<int> rank;
  std::string node;
  std::optional<int> exit_code;
  std::string message;  // free text for the event log ("killed by signal 9", "no such user alice")
};

// What an ENDING attempt still holds on a node that went down before its agent could
// confirm the attempt's ranks dead. The job moves on without it; the GPUs and the
// attempt's master port (those ranks may still connect to it) stay held until the agent
// confirms or an admin clears.
struct Fence {
  model::JobId job = 0;
  int attempt = 0;
  std::string node;
  std::vector<int> gpus;
  std::string host;  // the attempt's master port: its host
  int port = 0;      // 0: none (a fence written before fences held the port everywhere)

  bool operator==(const Fence&) const = default;
};

// One job state change. The service persists it (one transaction), then acts on it.
struct JobChange {
  model::JobId job = 0;
  model::JobState from = model::JobState::Pending;
  model::JobState to = model::JobState::Pending;
  JobEvent event = JobEvent::Schedule;
  int attempt = 0;                              // after the change
  // to == ENDING: the state it takes once every rank is confirmed gone.
  std::optional<model::JobState> outcome;
  // to == STARTING: the new allocation. Leaving ENDING (or STARTING on PortBusy): the one
  // released.
  std::optional<model::Allocation> allocation;
  // Leaving an attempt that started (to PENDING or a terminal state): when it started, on
  // the monotonic timeline (the job's run time; the scheduler keeps it no longer).
  std::optional<Instant> started;
  EventInfo info;
  std::string text;                             // for the job event log
};

// Tell these nodes' agents to kill every rank of the job's attempt.
struct KillRanks {
  model::JobId job = 0;
  int attempt = 0;
  std::vector<std::string> nodes;
};

using Decision = std::variant<JobChange, KillRanks>;

// The outcome of a dry run: where the job would go now, or why it would wait.
struct DryRun {
  std::optional<model::Allocation> allocation;
  PendingReason reason;
};

struct PassStats {
  int considered = 0;
  int started = 0;
  int backfilled = 0;
};

class Scheduler {
 public:
  explicit Scheduler(SchedOptions options = {});

  // ---- cluster ----
  // Adds or replaces a node (inventory, address, ports, state). A node going down loses
  // its jobs (NodeLost); drained nodes keep theirs but take no new ones.
  Result<std::vector<Decision>> update_node(const model::Node& node, Instant now);
  Result<std::vector<Decision>> set_node_state(std::string_view name, model::NodeState state,
                                               std::string reason, Instant now);
  // Whether the node's agent is connected and heard from. If not, the node gets no new job (pending
  // reason NodeDown), but its jobs are not lost by this alone (node_lost_timeout decides that).
  // A node is reachable when first added; the coordinator marks the nodes it reloads
  // after a restart unreachable until their agent says hello.
  Result<void> set_reachable(std::string_view name, bool reachable);
  bool reachable(std::string_view name) const;
  const model::Node* node(std::string_view name) const;
  std::vector<const model::Node*> nodes() const;
  // The job holding GPU `gpu_index` of `node`, if any.
  std::optional<model::JobId> gpu_holder(std::string_view node, int gpu_index) const;
  std::optional<model::JobId> port_holder(std::string_view host, int port) const;

  // ---- jobs ----
  // ResourceExhausted when no node the cluster knows could ever run the job.
  Result<void> admissible(const model::JobSpec& spec) const;
  // A new job, or one reloaded after a restart, in PENDING.
  Result<void> add_pending(model::JobId id, std::string user, model::JobSpec spec, Instant submitted_at,
                           int attempt = 0);
  // A job reloaded after a restart in STARTING, RUNNING or ENDING (with its outcome):
  // holds its GPUs and port again, except, for an ENDING job, on its `released_nodes`
  // (confirmed or fenced before the restart: they may serve another job by now). Its port
  // may already be held by its own fences.
  Result<void> restore_active(SchedJob job);
  // Feeds an event about a job's attempt. Conflict for stale attempts and events that do
  // not apply in the job's state; NotFound for unknown jobs.
  Result<std::vector<Decision>> on_event(model::JobId id, int attempt, JobEvent event, Instant now,
                                         const EventInfo& info = {});
  // An ENDING job's ranks on `node` are confirmed gone: that node's GPUs serve other jobs
  // from now on. The job keeps the rest, and its master port (ranks elsewhere may still
  // connect to it), until RanksGone. NotFound / Conflict when the job is not ENDING.
  Result<void> release_node(model::JobId id, std::string_view node, Instant now);
  // An ENDING job's ranks on `node` cannot be confirmed (the node is down): what the job
  // holds there becomes a Fence, and the job no longer waits for that node.
  Result<Fence> fence_node(model::JobId id, std::string_view node, Instant now);
  // Holds a fence again (after a restart). Conflict when its GPUs or port are taken.
  Result<void> restore_fence(const Fence& fence);
  // The node confirmed the attempt gone, or an admin cleared it: frees what the fence
  // held. False when there is no such fence.
  bool lift_fence(model::JobId job, int attempt, std::string_view node);
  const std::vector<Fence>& fences() const { return fences_; }
  const SchedJob* job(model::JobId id) const;
  std::size_t live_jobs() const { return jobs_.size(); }

  // ---- scheduling ----
  // One pass: time limits, then placement in queue order with backfill.
  std::vector<Decision> schedule(Instant now);
  // Whether a pass run now could start pending job `id`: false when the free GPUs of its
  // classes cannot hold its gang (then its pending reason is set, as a pass would).
  // After a submission and no other change, false means a pass would start nothing, so
  // the caller may leave the queue to the next pass that something else brings.
  bool might_start_now(model::JobId id);
  // Keeps a pending job out of every pass, with `reason`, until called with nullopt.
  // NotFound for a job that is not pending.
  Result<void> set_held(model::JobId id, std::optional<PendingReason> reason);
  DryRun dry_run(const model::JobSpec& spec, const std::string& user, Instant now) const;
  const PassStats& last_pass() const { return last_pass_; }
  double usage(const std::string& user) const { return fair_share_.usage(user); }

 private:
  struct NodeSlot {
    model::Node node;
    NodeLayout layout;
    bool reachable = true;                       // its agent is connected
    std::vector<model::JobId> holder;            // by GPU position; 0 = free
    std::unordered_map<int, int> position;       // GPU index -> position
  };
  struct ClassInfo {
    model::GpuClass cls;
    model::CudaVersion cuda;
  };
  enum class View { Free, IdleUp, IdleUpOrDrained, IdleAll };

  int class_id(const model::Gpu& gpu);
  const std::vector<int>& matching_classes(const SchedJob& job) const;
  std::vector<int> matching_classes(const model::GpuConstraint& c) const;
  Capacity build(View view) const;
  std::optional<Placement> place(const std::vector<std::pair<int, int>>& shapes, const std::vector<int>& classes,
                                 const Capacity& cap) const;
  // Whether some shape fits some class: counts only, no placement built.
  bool fits(const std::vector<std::pair<int, int>>& shapes, const std::vector<int>& classes,
            const Capacity& cap) const;
  std::optional<model::Allocation> with_port(const Placement& placement, Instant now) const;
  PendingReason diagnose(const model::JobSpec& spec, const std::vector<std::pair<int, int>>& shapes,
                         const std::vector<int>& classes, const Capacity& avail,
                         std::vector<std::optional<Capacity>>& views) const;
  std::string largest_free_set(const std::vector<int>& classes, const Capacity& avail) const;
  void reserve(const SchedJob& head, const std::vector<int>& classes, const Capacity& avail, Instant now,
               std::optional<Capacity>& unreserved, std::optional<Instant>& shadow) const;
  std::vector<Decision> lose_node(const std::string& name, const std::string& reason, Instant now);

  void hold(SchedJob& job, const model::Allocation& alloc, Instant now);
  void release(SchedJob& job, Instant now);
  // Frees the GPUs the job holds on one node (and the port if it lives there); returns
  // how many GPUs were freed.
  int release_on(SchedJob& job, const std::string& node);
  // The live job `id` if it is ENDING; NotFound or Conflict otherwise.
  Result<SchedJob*> ending_job(model::JobId id);
  std::vector<Decision> apply(SchedJob& job, const Transition& t, JobEvent event, Instant now,
                              const EventInfo& info);
  std::string describe(const SchedJob& job, const JobChange& change) const;

  SchedOptions options_;
  std::vector<NodeSlot> nodes_;
  std::unordered_map<std::string, int> node_index_;
  std::vector<NodeLayout> layouts_;  // parallel to nodes_, for placement
  int max_gpus_per_node_ = 0;
  std::vector<ClassInfo> classes_;
  std::map<model::GpuClass, int> class_index_;
  std::unordered_map<model::JobId, SchedJob> jobs_;
  // Per-job cache of matching classes; cleared when a new class appears.
  mutable std::unordered_map<model::JobId, std::vector<int>> class_cache_;
  PortBook ports_;
  std::vector<Fence> fences_;
  FairShare fair_share_;
  std::unordered_map<std::string, int> gpus_by_user_;
  PassStats last_pass_;
};

}  // namespace corral::sched
