#pragma once
// Ledger: the one owner and writer of every job's and rank's state. Requests and agent
// reports come in as calls, with the time passed in; what must be persisted and what
// must be sent come out as Effects, which the caller commits (one transaction) and only
// then sends: persist, send, log. It asks the pure Scheduler for placements and holds
// GPUs and ports through it; it does no I/O, reads no clock and keeps no socket, so it
// runs the same under the coordinator's event loop and under the deterministic
// simulation (tests/unit/ledger). Not thread-safe: one caller at a time.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/histogram.hpp"
#include "common/core/time.hpp"
#include "common/model/config.hpp"
#include "common/model/job_spec.hpp"
#include "common/protocol/messages.hpp"
#include "coordinator/sched/scheduler.hpp"
#include "coordinator/store/store.hpp"

namespace corral::ledger {

struct Outgoing {
  std::string node;
  protocol::CoordinatorMessage message;
};

// What one call changed. The caller persists `changes` (in order, together), and once
// they are durable sends `messages` and answers the waits of `ended`.
struct Effects {
  std::vector<store::Change> changes;
  std::vector<Outgoing> messages;
  std::vector<model::JobId> ended;                          // their end is in `changes`
  std::vector<std::pair<std::string, std::string>> close;   // agent links to close, and why
  bool pass_wanted = false;                                 // a scheduling pass could place something
};

struct LedgerStats {
  std::uint64_t submitted = 0;
  std::uint64_t ended[model::kJobStateCount] = {};  // by JobState
  std::map<std::pair<model::JobState, std::string>, std::uint64_t> ended_by_user;  // (state, user)
  // Submit (or requeue) to start, by the product of the job's GPUs; and start to end.
  std::map<std::string, Histogram> queue_wait_by_class;
  Histogram run_seconds{{10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400}};
};
// The bounds of queue_wait_by_class, in seconds.
inline const std::vector<double> kQueueWaitBounds = {1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400};

class Ledger {
 public:
  // A job that is not over (or only just over), with its spec parsed.
  struct Job {
    store::JobRecord record;
    model::JobSpec spec;
    // Per node, the link generation on which this attempt's Launch went out: a rank that
    // its agent has not reported after Synced is only lost if the Launch went out on an
    // earlier connection (or before a restart).
    std::map<std::string, std::uint64_t> launched_on;
    // The rank-0 node's link generation when Prepare went out; `prepared` once its
    // answer came (in this process's life).
    std::optional<std::uint64_t> prepare_sent_on;
    bool prepared = false;
    // The attempt's rendezvous deadline (launch.rendezvous_timeout): waiting for every
    // rank to check in, then asking the agents of the missing ranks what those do, then
    // done (failed, warned, or every rank in).
    struct Rendezvous {
      enum class Phase { Waiting, Inspecting, Done };
      Phase phase = Phase::Waiting;
      Instant answers_by{};
      std::set<std::string> asked;  // nodes whose Inspection has not come yet
      std::vector<std::pair<std::string, protocol::RankProcess>> found;  // (node, what its rank does)
    };
    Rendezvous rendezvous;
    // launch.hang_timeout: the ranks whose agents report no progress, since when (their
    // agent's idle time subtracted) and in which state; whether the hang was reported.
    struct Hang {
      struct Stall {
        Instant since{};
        std::string state;
      };
      std::map<int, Stall> stalled;
      bool reported = false;
    };
    Hang hang;
  };
  // What a node's agent last told us.
  struct Link {
    bool connected = false;
    Instant last_seen{};
    std::string driver;
    model::CudaVersion cuda;
    std::vector<protocol::RunningRank> reported;  // from its last Hello
    bool lost = false;                            // declared gone (its jobs lost) since its last Hello
    // Silent past node_timeout since its last Hello: no new job goes there, its jobs were
    // told once, and they run on until node_lost_timeout. What fell silent (a heartbeat
    // that stopped on an open link, or a link that closed) names the loss, if it comes.
    bool silent = false;
    bool silent_link_open = false;
    Instant silent_from{};  // its last_seen when it was found silent
    // Back from such a silence, after this long: its jobs are told once it has Synced.
    std::optional<Duration> back_after;
    std::uint64_t generation = 0;                 // counts Hellos
    bool synced = false;                          // Synced since its last Hello
    // The agent serves another cluster (its Hello named it): held, never obeyed or heard
    // but for heartbeats, until it says hello as one of ours.
    std::string foreign;
  };

  explicit Ledger(model::CoordinatorConfig config);
  // This cluster's identity, told to every agent in Welcome; an agent whose Hello names
  // another is held (drained, its ranks neither kept nor killed, its reports ignored).
  void set_cluster(std::string identity) { cluster_ = std::move(identity); }
  // Whether `node`'s agent is held as another cluster's: its reports are not acknowledged.
  bool holds_foreign(const std::string& node) const;

  // A job the ledger no longer holds, as the store knows it: its state and, for an array's
  // element, its array. For dependencies (after_ok, ...) on old jobs.
  struct StoredJob {
    model::JobState state = model::JobState::Pending;
    std::optional<store::ArrayElement> array;
  };
  // nullopt for a job that does not exist.
  using EndedLookup = std::function<std::optional<StoredJob>(model::JobId)>;

  // Rebuilds the state from what the store loaded. Jobs that were running wait
  // `reconnect_grace` for their agents to report them; no node takes a job before its
  // agent says hello.
  Result<void> restore(store::Snapshot snapshot, Now now, const EndedLookup& ended = {});

  // ---- requests
  struct Submitted {
    model::JobId id = 0;                 // the first (an array's id)
    std::vector<model::JobId> ids;       // every job made: one, or an array's elements
    store::Change change;  // the new job: commit it, then acknowledge (not in take())
  };
  // `submission`: where it was submitted from and the environment exported with it
  // (checked by the caller). A job with dependencies waits (Dependency) until each is
  // met; one that can never be met (after_ok on a job that failed) ends it CANCELLED
  // (DependencyNeverSatisfied). InvalidArgument naming the field for a job that does not
  // exist.
  Result<Submitted> submit(const std::string& user, model::JobSpec spec, std::string spec_text, Now now,
                           model::Submission submission = {}, const EndedLookup& ended = {});
  // NotFound, PermissionDenied (not the owner nor an admin), Conflict (ended or ending).
  Result<void> cancel(model::JobId id, const std::string& user, bool admin, Now now);
  // An admin drains or resumes a node. NotFound, InvalidArgument.
  Result<void> set_drained(const std::string& node, bool drained, const std::string& reason, Now now);
  // An admin says the node's unconfirmed ranks are dead: (job, attempt) of each cleared.
  // NotFound; Conflict while its agent is connected.
  Result<std::vector<std::pair<model::JobId, int>>> clear_node(const std::string& node, const std::string& by,
                                                               Now now);

  // ---- time
  // One scheduling pass (time limits, placements); nothing while in the reconnect grace.
  void schedule(Now now);
  // Ends the reconnect grace when due. A node silent for node_timeout takes no new job and
  // its jobs are told (their ranks run on); silent for node_lost_timeout, it is lost.
  void tick(Now now);

  // ---- agents (the node name comes from the agent's certificate)
  // InvalidArgument when the node cannot be taken (close its link with the message).
  Result<void> agent_hello(const std::string& node, protocol::Hello hello, Now now);
  void agent_disconnected(const std::string& node);
  // Any message after Hello but LogData, which the caller answers itself.
  void agent_message(const std::string& node, const protocol::AgentMessage& message, Now now);

  // ---- reads
  const Job* live_job(model::JobId id) const;
  const Job* any_job(model::JobId id) const;  // live, fenced or recently ended
  const std::unordered_map<model::JobId, Job>& live_jobs() const { return jobs_; }
  const Link* link(const std::string& node) const;
  const sched::Scheduler& scheduler() const { return scheduler_; }
  bool in_grace() const { return in_grace_; }
  bool connected(const std::string& node) const;
  // When the node is lost if its agent stays away: nullopt while its agent is connected
  // and heard from (or the node is lost already, or unknown).
  std::optional<Instant> lost_at(const std::string& node) const;
  const LedgerStats& stats() const { return stats_; }
  // The live elements of array `array` (its first element's id), in index order.
  std::vector<model::JobId> array_elements(model::JobId array) const;
  // Whether a pass run now could start job `id` (sets its pending reason if not).
  bool might_start_now(model::JobId id) { return scheduler_.might_start_now(id); }

  // The effects accumulated since the last take(); the jobs whose dependencies the jobs
  // that ended settled are released or cancelled first. What rank reports changed in a
  // job's ranks alone (a pid, an exit code, a check-in, a warning: nothing that decides
  // what the job holds) comes last in `changes`, one write of the job's latest record; or,
  // with `defer_rank_records`, stays with the ledger for take_rank_records().
  Effects take(bool defer_rank_records = false);
  // The writes take(true) left: one UpdateJob of its latest record per job whose ranks
  // changed since the last call. Committed after everything taken before them, they hold
  // just what the last of those writes held. So a gang of a thousand nodes whose every
  // rank reports on its own costs one copy of its record per transaction, not per report.
  std::vector<store::Change> take_rank_records();
  bool rank_records_due() const { return !ranks_changed_.empty(); }

 private:
  Job* live(model::JobId id);
  Job* any(model::JobId id);
  void remember_ended(Job job);
  // Lets go of ended jobs past the window (remember_ended): the store has them.
  void forget_ended(Instant now);
  // ---- dependencies (after_ok, after_any, after_not_ok)
  // Registers a pending job's dependencies; those on jobs that ended are settled now.
  void watch_dependencies(Job& job, const EndedLookup& ended);
  // What a dependency on `id` waits for: the job, or, for an array's id, every element
  // (as Slurm's afterok on an array job).
  std::vector<model::JobId> dependency_targets(model::JobId id, const EndedLookup& ended);
  // A job the dependent waits for ended in `state`: met, or never (the dependent is cancelled).
  void dependency_ended(model::JobId dependent, model::JobId dep, model::JobState state);
  // Holds the job (Dependency, naming what it waits for) or lets the scheduler place it.
  void update_hold(model::JobId dependent);
  // Settles the dependents of every job that ended since the last call (they may end in turn).
  void settle_dependencies();
  // An array with "%N": holds back the pending elements beyond what N allows now.
  void update_array(model::JobId array);
  std::vector<store::RankRecord> rank_records(const model::JobSpec& spec, const model::Allocation& alloc) const;
  void persist_job(const Job& job, std::string event_text);
  // For a change to the job's ranks that moves none of its holds (not `gone`): the event
  // now, the record once per batch (take_rank_records).
  void persist_ranks(const Job& job, std::string event_text);
  void apply(const std::vector<sched::Decision>& decisions);
  void apply_change(const sched::JobChange& change);
  void send(const std::string& node, protocol::CoordinatorMessage message);
  void send_prepare(Job& job);
  // To every node of the job, or to `only` (a Launch its agent never got).
  void send_launch(Job& job, const std::string& only = {});
  // After `node` synced: a STARTING job's Prepare or Launch that went out on an earlier
  // connection (or before a restart) and was never answered goes out again.
  void resume_launch(Job& job, const std::string& node);
  void job_event(model::JobId id, int attempt, sched::JobEvent event, const sched::EventInfo& info = {});
  void end_grace();
  bool all_running_nodes_synced() const;
  void node_changed(const model::Node& node, const std::vector<sched::Decision>& decisions);
  void node_lost(const std::string& name, const std::string& reason);
  // Silent past node_timeout: no new job there, its link closed, each job with ranks
  // there told once. Lost only at node_lost_timeout.
  void node_silent(const std::string& name, Link& link);
  // The live jobs with ranks on `node` not yet confirmed gone, in id order.
  std::vector<model::JobId> jobs_on(const std::string& node) const;
  // How long a node may be silent before it is lost (never shorter than node_timeout).
  Duration lost_timeout() const { return std::max(config_.node_lost_timeout, config_.node_timeout); }
  void on_health(const std::string& node, const protocol::Health& health);
  void on_prepare_result(const std::string& node, const protocol::PrepareResult& m);
  store::RankRecord* own_rank(Job* job, const std::string& node, int attempt, int rank);
  void on_rank_started(const std::string& node, const protocol::RankStarted& m);
  void on_rank_exited(const std::string& node, const protocol::RankExited& m);
  void on_synced(const std::string& node);
  void on_attempt_gone(const std::string& node, const protocol::AttemptGone& m);
  void on_rank_joined(const std::string& node, const protocol::RankJoined& m);
  void on_inspection(const std::string& node, const protocol::Inspection& m);
  void on_rank_stall(const std::string& node, const protocol::RankStall& m);
  // Reports a hang (once) when every running rank of the job is stalled.
  void check_hang(Job& job);
  // How long the agents have to say what their missing ranks do.
  static constexpr Duration kInspectAnswerTime = std::chrono::seconds(2);
  // Adds a warning to the rank's record (shown by corral show), once; the caller persists.
  static constexpr std::size_t kMaxRankWarnings = 8;
  // False when the rank has it already.
  bool rank_warning(Job& job, int rank, std::string warning);
  void on_rank_warning(const std::string& node, const protocol::RankWarning& m);
  // At the deadline: asks the agents of the ranks that did not check in what they do;
  // once they answered (or a second passed), fails the job or warns.
  void check_rendezvous(Job& job);
  // When the live job's attempt started, on the monotonic timeline (the scheduler keeps
  // it; a wall-clock step moves no deadline counted from it); nullopt before it started.
  std::optional<Instant> attempt_started(model::JobId id) const;
  void end_rendezvous(Job& job);
  // Records that no process of the job's attempt is left on `node`; RanksGone once that
  // holds on every node. `why` goes to the event log.
  void confirm_gone(Job& job, const std::string& node, const std::string& why);
  // Frees the nodes of an ENDING job whose ranks are all confirmed gone, fences those of
  // lost nodes; RanksGone when every node is one or the other.
  void settle_ending(Job& job);
  store::JobRecord* fence_owner(model::JobId id);
  void lift_fence(model::JobId id, int attempt, const std::string& node, const std::string& why);
  bool agent_lost(const std::string& node) const;
  void kill_unconfirmed(const std::string& node);
  void settle_all_ending();
  void reconcile(const std::string& node);

  model::CoordinatorConfig config_;
  sched::Scheduler scheduler_;
  std::map<std::string, Link> links_;
  // When tick next walks links_ for silent nodes, and how many links it walked last.
  Instant next_silence_check_{};
  std::size_t links_at_silence_check_ = 0;
  std::unordered_map<model::JobId, Job> jobs_;  // live jobs
  std::map<model::JobId, Job> fenced_;          // ended, but earlier attempts hold fences
  std::map<model::JobId, Job> ended_;           // recently ended, for late rank reports
  std::deque<std::pair<model::JobId, Instant>> ended_order_;  // with when each ended
  // dependent -> (job waited for -> how), while the dependent is pending; and the other
  // way round, job -> its dependents. `ended_unsettled_`: jobs ended since the last take().
  std::map<model::JobId, std::map<model::JobId, model::DependencyKind>> unmet_;
  std::map<model::JobId, std::set<model::JobId>> dependents_;
  std::vector<std::pair<model::JobId, model::JobState>> ended_unsettled_;
  // Arrays with live elements: the most running at once (0: no limit), the live element
  // ids; the pending elements their limit holds back; arrays to look at again.
  struct ArrayInfo {
    int max_running = 0;
    std::set<model::JobId> live;
  };
  std::map<model::JobId, ArrayInfo> arrays_;
  std::set<model::JobId> over_limit_;
  std::set<model::JobId> arrays_dirty_;
  model::JobId max_job_id_ = 0;
  std::string cluster_;
  bool in_grace_ = false;
  Instant grace_ends_{};
  Now now_{};  // the time of the call being handled
  Effects out_;
  std::set<model::JobId> ranks_changed_;  // persist_ranks since the last take_rank_records
  LedgerStats stats_;
};

}  // namespace corral::ledger
