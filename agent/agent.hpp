#pragma once
// Agent: one per node. Its parts, each in a file of its own and tested alone: the link to
// the coordinator with its heartbeats and unacknowledged reports (coordinator_link,
// outbox), master ports held from Prepare to the start of rank 0 (master_port), the NCCL
// bootstrap root in a child (nccl_root), ranks started (rank_start) and killed
// (kill_escalation), what is left of an attempt swept before its GPUs are given back
// (attempt_sweep), logs and orphan markers kept (spool) and served (log_reader), and the
// rendezvous and progress watch (rank_watch). The Agent ties them to each job's state.
// Ranks keep running while the coordinator is away; what happened meanwhile is sent
// when the link is back. Lives on one event loop thread, which never waits: user
// lookups, forks, external commands (nvidia-smi, the preflight), reads of /proc and of
// logs, and the wait for nccl-root's ID run on BlockingWork threads and come back to the
// loop as results.

#include <sys/types.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "agent/inventory/nvidia_smi.hpp"
#include "agent/nccl_root.hpp"
#include "agent/rank_watch.hpp"
#include "agent/spool.hpp"
#include "agent/spool_health.hpp"
#include "common/model/config.hpp"
#include "common/net/blocking_work.hpp"
#include "common/net/event_loop.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

struct StartOutcome;
class AttemptSweep;
class CoordinatorLink;
class KillEscalation;

// Each runs on a BlockingWork thread, never on the loop: they may take minutes.
struct AgentHooks {
  // Before the first Hello: fills in the node's GPUs, driver, CUDA version and
  // health_error (nvidia-smi and the first preflight). Unset: `node` has them already.
  std::function<protocol::Hello(protocol::Hello node)> survey;
  // Runs the node checklist against the GPUs found at start (`expected`); "" when
  // healthy, else why the node should be drained.
  std::function<std::string(std::size_t expected)> preflight;
  // The processes using the node's GPUs now (nvidia-smi --query-compute-apps, or the
  // simulated inventory's file), to find ranks using GPUs not their own, and anything
  // still holding an attempt's GPUs once its ranks are dead; unset: neither is checked.
  std::function<Result<std::vector<ComputeApp>>()> compute_apps;
  // Each GPU's utilization now, in percent by index (nvidia-smi, or the simulated
  // inventory's file): a rank whose GPUs are busy is not hung, whatever its CPU does.
  // Unset: the hang detector goes by CPU alone.
  std::function<Result<std::map<int, int>>()> gpu_utilization;
};

class Agent {
 public:
  // `node` carries everything Hello reports but the running ranks.
  Agent(net::EventLoop& loop, model::AgentConfig config, protocol::Hello node, AgentHooks hooks);
  ~Agent();

  // Kills ranks an earlier agent process left behind, then connects.
  Result<void> start();
  void stop();

  bool connected() const;
  std::size_t running_ranks() const;

 private:
  using Key = std::pair<model::JobId, int>;  // (job, attempt)
  struct Rank {
    int rank = 0;
    pid_t pid = 0;
    bool exited = false;
    // Exited, and its process group seen empty since: the kernel may give the group's id
    // to any new process, so it is never signalled again.
    bool group_gone = false;
    bool joined = false;  // checked in to the rendezvous (RankJoined sent)
    std::string log;
    std::vector<int> gpus;
    CpuProgress progress = {};  // with launch.hang_timeout: whether it still uses CPU
    std::string stalled_state = {};  // its state when it was reported stalled
    int join_looks = 0;              // times its check-in was looked for
    std::set<std::string> warned = {};  // RankWarning texts sent
  };
  struct Job {
    std::map<int, Rank> ranks;
    int probe_fd = -1;          // the master port, held from Prepare until rank 0 starts
    NcclRootHold nccl_root;     // mode nccl: the bootstrap root, from Prepare to the end
    std::uint64_t prepare = 0;  // which Prepare a pending nccl-root answer belongs to
    bool launching = false;     // its ranks, or its nccl-root, are being started on the launch thread
    bool killing = false;
    Duration kill_grace{0};     // a kill asked for while launching, done once started
    // Torch mode: where ranks check in (rank 0 listens, the others connect); empty when
    // the rendezvous is not watched (nccl mode, whose ranks meet at nccl-root).
    std::string master_addr;
    int master_port = 0;
    Duration hang_timeout{0};  // launch.hang_timeout; 0: its ranks' progress is not watched
    std::unique_ptr<KillEscalation> escalation;  // SIGTERM, then SIGKILL after the grace
    std::unique_ptr<AttemptSweep> sweep;          // looking for what is left of it (finish_kill)
    // Its ranks' GPUs: nothing may hold them when the attempt is confirmed gone.
    std::vector<std::string> gpu_uuids;
  };
  protocol::Hello hello() const;
  void on_message(protocol::CoordinatorMessage message);
  void send(const protocol::AgentMessage& message);

  void on_welcomed();
  void on_reconcile(const protocol::Reconcile& m);
  void on_prepare(const protocol::Prepare& m);
  void on_launch(const protocol::Launch& m);
  void on_kill(const protocol::Kill& m);
  void on_log_request(const protocol::LogRequest& m);
  void on_inspect(const protocol::Inspect& m);
  void on_stack_request(const protocol::StackRequest& m);
  // The ranks asked for, each with its process group (0 when not running here).
  std::vector<WatchedRank> watched(const Key& key, const std::vector<int>& ranks) const;
  // Records that the rank checked in and reports it, once.
  void mark_joined(const Key& key, int rank);

  // Runs `work` on a BlockingWork thread and `done` on the loop, after reaping what
  // exited meanwhile (a command's exit may have held back the reaping of others).
  template <class Work, class Done>
  void offload(net::BlockingWork& pool, Work work, Done done);
  // Answers a Prepare that cannot be met and lets go of what it held.
  void prepare_failed(const Key& key, protocol::PrepareResult result, const Error& why);
  void on_nccl_root_started(const Key& key, std::uint64_t prepare, protocol::PrepareResult result,
                            const Result<NcclRootChild>& root);
  void on_nccl_root_answer(const Key& key, std::uint64_t prepare, protocol::PrepareResult result,
                           const Result<std::string>& id);
  void on_started(const Key& key, StartOutcome outcome);
  void send_synced_when_ready();
  void reap();
  // group_gone: the rank's group was seen empty since its leader was reaped.
  void rank_done(const Key& key, Rank& rank, int status, bool group_gone = false);
  void kill_job(const Key& key, Duration grace);
  void signal_ranks(const Key& key, Duration grace);
  void finish_kill(const Key& key);
  void on_swept(const Key& key, const std::string& left);
  void attempt_gone(const Key& key, const Result<std::vector<std::string>>& gpus_held);
  void remember_finished(const Key& key);
  void release_job_resources(Job& job);
  void kill_orphans();
  // Records a rank's end in the spool, reports it, and forgets its marker (`marker`)
  // once the coordinator acknowledges the report (on_acknowledged).
  void report_end(protocol::RankExited m, std::string marker);
  void on_acknowledged();
  void run_preflight();
  // What Hello and Health say: the preflight's and the GPU checks' problem, and the
  // spool's, each kept apart so that one clearing does not hide the other.
  std::string node_health() const;
  void send_health();
  // Every second, off the loop: each log of a rank that may still write cut to
  // rank_log_cap (log_cap), and whether the spool can take writes.
  void check_logs();
  void on_logs_checked(const std::vector<std::tuple<Key, int>>& ranks, const std::string& problem);
  // Once the node is surveyed: the link, and the periodic preflight.
  void on_surveyed(protocol::Hello node);
  // Looks, off the loop, for ranks that checked in since the last look, and every
  // kHangSampleEvery-th time at the CPU time of the ranks whose progress is watched.
  void watch_ranks();
  // Every kGpuCheckEvery-th look: the processes on the GPUs (nvidia-smi, off the loop and
  // apart from the looks) against each rank's own GPUs; RankWarning for a misuse.
  void check_gpu_use(std::vector<std::pair<Key, std::vector<std::pair<WatchedRank, std::vector<int>>>>> on_gpus);
  // A rank of a job here that has not exited; {nullptr, nullptr} otherwise.
  std::pair<Job*, Rank*> running_rank(const Key& key, int r);
  void let_go_of_empty_groups();

  net::EventLoop& loop_;
  model::AgentConfig config_;
  Spool spool_;
  protocol::Hello node_;
  AgentHooks hooks_;
  std::unique_ptr<CoordinatorLink> link_;
  bool stopping_ = false;
  std::unique_ptr<net::Timer> preflight_timer_;
  std::unique_ptr<net::Timer> watch_timer_;
  bool watch_running_ = false;
  // The last reading of the GPUs' utilization (percent by index), when it came, and
  // whether the next is being read.
  std::map<int, int> gpu_busy_;
  CpuProgress::Clock::time_point gpu_busy_at_{};
  bool gpu_busy_reading_ = false;
  bool gpu_check_running_ = false;  // check_gpu_use's nvidia-smi is being read
  std::uint64_t watch_count_ = 0;
  std::map<Key, Job> jobs_;
  std::deque<Key> finished_;  // attempts that ended here, most recent last
  // Ends reported and not yet acknowledged: (the report's number, the rank's marker).
  std::deque<std::pair<std::uint64_t, std::string>> ends_reported_;
  std::string agent_id_;  // CORRAL_AGENT_ID of the ranks started here
  std::string interface_;
  std::string health_error_;
  SpoolHealth spool_health_;
  std::unique_ptr<net::Timer> log_timer_;
  bool preflight_running_ = false;
  std::uint64_t prepares_ = 0;
  // Launches on the launch thread: until they are back, Synced waits (the coordinator
  // must hear of their ranks first), and exits of pids not known yet are kept.
  int launches_in_flight_ = 0;
  bool synced_pending_ = false;
  // By pid: the wait status, and whether the process's group was empty when it was reaped
  // (from then on its id may be any new process's: it is not signalled).
  std::map<pid_t, std::pair<int, bool>> unclaimed_exits_;
  // The launch thread alone looks users up and forks ranks; the others run commands,
  // sweeps of /proc and waits. Declared last: destroyed first, so no result arrives late.
  std::unique_ptr<net::BlockingWork> launcher_;
  std::unique_ptr<net::BlockingWork> work_;
  // corral stack's gdb and py-spy runs, one at a time, apart from the watch and the kills.
  std::unique_ptr<net::BlockingWork> stacks_;
  // Log reads (corral logs), in order, apart from commands that may hang.
  std::unique_ptr<net::BlockingWork> logs_;
  int stacks_waiting_ = 0;
};

}  // namespace corral::agent
