#include "agent/agent.hpp"

#include <arpa/inet.h>

#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "agent/attempt_sweep.hpp"
#include "agent/coordinator_link.hpp"
#include "agent/gpu_misuse.hpp"
#include "agent/inventory/run_command.hpp"
#include "agent/kill_escalation.hpp"
#include "agent/launcher.hpp"
#include "agent/log_cap.hpp"
#include "agent/log_reader.hpp"
#include "agent/master_port.hpp"
#include "agent/nccl_root.hpp"
#include "agent/rank_env.hpp"
#include "agent/rank_start.hpp"
#include "agent/rank_stack.hpp"
#include "agent/rank_watch.hpp"
#include "common/core/check.hpp"
#include "common/core/overloaded.hpp"
#include "common/core/time.hpp"
#include "common/protocol/codec.hpp"

namespace corral::agent {

namespace fs = std::filesystem;

// How often ranks that have not checked in yet are looked for (measured: docs/performance.md).
constexpr Duration kRendezvousWatchInterval = std::chrono::milliseconds(200);
// Progress (launch.hang_timeout) is sampled every 5th look: once a second.
constexpr std::uint64_t kHangSampleEvery = 5;
// A rank's check-in is looked for at every look for its first 30 s, then every 5th.
constexpr int kEagerJoinLooks = 150;
constexpr std::uint64_t kLateJoinEvery = 5;
// corral stack requests a node queues before it answers "busy".
constexpr int kMaxStackRequests = 4;
// The processes on the GPUs (nvidia-smi) are compared with the ranks' every 25th: 5 s.
constexpr std::uint64_t kGpuCheckEvery = 25;
// The GPUs' utilization, asked of nvidia-smi while a rank on GPUs idles on the CPU, serves
// the progress samples for 5 s: a hang is seen at most that much later, and a hung job
// does not cost the node an nvidia-smi every second.
constexpr std::chrono::seconds kGpuUtilizationServes{5};
// How often ranks' logs are held to rank_log_cap: a log passes the cap by at most what its
// rank writes in this time.
constexpr Duration kLogCheckInterval = std::chrono::seconds(1);


template <class Work, class Done>
void Agent::offload(net::BlockingWork& pool, Work work, Done done) {
  pool.run(std::move(work), [this, done = std::move(done)](auto&&... result) mutable {
    reap();
    done(std::forward<decltype(result)>(result)...);
  });
}

Agent::Agent(net::EventLoop& loop, model::AgentConfig config, protocol::Hello node, AgentHooks hooks)
    : loop_(loop), config_(std::move(config)), spool_(config_.spool), node_(std::move(node)), hooks_(std::move(hooks)) {
  health_error_ = node_.health_error;
  // Made now, dialled in start(): reports made before (the leftovers') are held for it.
  net::WsClientOptions opts;
  opts.url = config_.coordinator;
  opts.tls = {config_.ca, config_.cert, config_.key};
  link_ = std::make_unique<CoordinatorLink>(
      loop_, opts, config_.reconnect_max_backoff,
      CoordinatorLink::Handlers{[this] { return hello(); }, [this] { on_welcomed(); },
                                [this](protocol::CoordinatorMessage m) { on_message(std::move(m)); },
                                [this] { on_acknowledged(); }});
  launcher_ = std::make_unique<net::BlockingWork>(loop_, 1, "agent-launch");
  work_ = std::make_unique<net::BlockingWork>(loop_, 4, "agent-work");
  stacks_ = std::make_unique<net::BlockingWork>(loop_, 1, "agent-stacks");
  logs_ = std::make_unique<net::BlockingWork>(loop_, 1, "agent-logs");
}

Agent::~Agent() { stop(); }

std::size_t Agent::running_ranks() const {
  std::size_t n = 0;
  for (const auto& [key, job] : jobs_) {
    for (const auto& [r, rank] : job.ranks) n += !rank.exited;
  }
  return n;
}

void Agent::kill_orphans() {
  // Ranks an earlier agent process started: nobody watches them any more, and this
  // process cannot wait for them. Kill them, unless the pid was reused since, and report
  // each as ended: a coordinator that did not lose this node (the restart took less than
  // node_lost_timeout) still counts them as running, and fails or requeues their job now. A
  // rank that ended under the earlier agent, which could not get its report acknowledged,
  // is reported as it ended. Each marker goes once its report is acknowledged. Each
  // attempt is then swept as one whose ranks ended here, and confirmed gone (AttemptGone).
  // Called before the loop runs: the sweeps of /proc may take their time here.
  for (const auto& left : spool_.leftovers()) {
    const bool leader =
        left.pid > 0 && !left.start_time.empty() && process_start_time(left.pid) == left.start_time;
    bool alive = leader;
    if (alive) {
      spdlog::warn("killing rank process group {} left by an earlier agent ({})", left.pid, left.marker);
      signal_group(left.pid, SIGKILL);
    }
    if (!left.named) {
      spool_.forget(left.marker);
      continue;
    }
    // Also what left the rank's group, or a rank whose pid never reached its marker (the
    // earlier agent died between the fork and writing it): found by its environment.
    for (pid_t pid : attempt_processes(left.job, left.attempt, agent_id_)) {
      spdlog::warn("killing pid {} of job {} attempt {} left by an earlier agent", pid, left.job, left.attempt);
      ::kill(pid, SIGKILL);
      alive = true;
    }
    protocol::RankExited m{left.job, left.attempt, left.rank, 0, 0, "", false};
    if (auto ended = spool_.recorded_exit(left.job, left.attempt, left.rank)) {
      m = *ended;
    } else if (alive) {
      m.signal = SIGKILL;
      m.reason = "killed by signal 9: left running by an earlier corral-agent process (the agent restarted)";
    } else {
      m.exit_code = -1;
      m.reason = "ended while no corral-agent ran on the node (the agent restarted); exit status unknown";
    }
    report_end(m, left.marker);  // queued until the coordinator welcomes us
    // Its group's id is ours only if its leader was found alive (and killed) just now.
    Job& job = jobs_[{left.job, left.attempt}];
    job.killing = true;
    job.gpu_uuids.insert(job.gpu_uuids.end(), left.gpu_uuids.begin(), left.gpu_uuids.end());
    job.ranks[left.rank] = Rank{left.rank, left.pid, true, !leader, false, "", {}};
  }
  std::vector<Key> left;
  for (const auto& [key, job] : jobs_) left.push_back(key);
  for (const auto& key : left) finish_kill(key);
}

void Agent::report_end(protocol::RankExited m, std::string marker) {
  // Dated now, by this node's clock, unless the record it came from was (an end seen by
  // an earlier agent process): the coordinator may hear of it much later.
  if (m.ended_at_ms == 0) m.ended_at_ms = to_millis(SystemClock().now());
  // Kept on disk first: an agent killed before the report is acknowledged leaves the
  // marker and this record to the next one, which says it again.
  spool_.record_exit(m);
  send(m);
  ends_reported_.emplace_back(link_->reports_made(), std::move(marker));
}

void Agent::on_acknowledged() {
  while (!ends_reported_.empty() && ends_reported_.front().first <= link_->settled()) {
    spool_.forget(ends_reported_.front().second);
    ends_reported_.pop_front();
  }
}

Result<void> Agent::start() {
  if (auto made = spool_.create(); !made) return std::unexpected(made.error());
  auto id = spool_.agent_id();
  if (!id) return std::unexpected(id.error());
  agent_id_ = *id;
  kill_orphans();
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  interface_ = interface_for_address(config_.advertise).value_or("");
  if (interface_.empty()) {
    spdlog::warn("no interface holds the advertised address {}; GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are not set",
                 config_.advertise);
  }
  loop_.on_signal(SIGCHLD, [this] { reap(); });
  preflight_timer_ = std::make_unique<net::Timer>(loop_);
  watch_timer_ = std::make_unique<net::Timer>(loop_);
  watch_timer_->start_repeating(kRendezvousWatchInterval, [this] { watch_ranks(); });
  log_timer_ = std::make_unique<net::Timer>(loop_);
  log_timer_->start_repeating(kLogCheckInterval, [this] { check_logs(); });
  if (!hooks_.survey) {
    on_surveyed(node_);
    return {};
  }
  // nvidia-smi and the preflight may take minutes: the loop runs (signals, the leftovers'
  // reports queued) while they do, and the node joins once they are done.
  spdlog::info("surveying the node (nvidia-smi, preflight) before joining");
  offload(
      *work_, [survey = hooks_.survey, node = node_] { return survey(node); },
      [this](protocol::Hello node) { on_surveyed(std::move(node)); });
  return {};
}

void Agent::on_surveyed(protocol::Hello node) {
  if (stopping_) return;
  node_ = std::move(node);
  health_error_ = node_.health_error;
  if (hooks_.preflight) preflight_timer_->start_repeating(config_.preflight_interval, [this] { run_preflight(); });
  link_->start();
}

void Agent::stop() {
  if (stopping_) return;
  stopping_ = true;
  if (preflight_timer_) preflight_timer_->cancel();
  if (watch_timer_) watch_timer_->cancel();
  if (log_timer_) log_timer_->cancel();
  link_->stop();
}

bool Agent::connected() const { return link_->welcomed(); }

protocol::Hello Agent::hello() const {
  protocol::Hello hello = node_;
  hello.health_error = node_health();
  hello.running.clear();
  for (const auto& [key, job] : jobs_) {
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.exited) hello.running.push_back({key.first, key.second, r, rank.pid});
    }
  }
  return hello;
}

void Agent::send(const protocol::AgentMessage& message) { link_->send(message); }

void Agent::on_message(protocol::CoordinatorMessage message) {
  // Welcome and Ack are the link's (CoordinatorLink).
  std::visit(Overloaded{[](const protocol::Welcome&) {}, [](const protocol::Ack&) {},
                        [this](const protocol::Reconcile& m) { on_reconcile(m); },
                        [this](const protocol::Prepare& m) { on_prepare(m); },
                        [this](const protocol::Launch& m) { on_launch(m); },
                        [this](const protocol::Kill& m) { on_kill(m); },
                        [this](const protocol::LogRequest& m) { on_log_request(m); },
                        [this](const protocol::Inspect& m) { on_inspect(m); },
                        [this](const protocol::StackRequest& m) { on_stack_request(m); }},
             message);
}

void Agent::on_welcomed() {
  // Stalls are held in the coordinator's memory: a restarted one hears them again.
  const auto now = CpuProgress::Clock::now();
  for (const auto& [key, job] : jobs_) {
    for (const auto& [r, rank] : job.ranks) {
      if (rank.exited || !rank.progress.stalled()) continue;
      send(protocol::RankStall{key.first, key.second, r, true, rank.progress.idle(now).count(), rank.stalled_state});
    }
  }
  synced_pending_ = true;
  send_synced_when_ready();
}

void Agent::send_synced_when_ready() {
  // Everything held back is on its way, and no launch is still starting ranks the
  // coordinator has not heard of: it may now judge what we do not run.
  if (!synced_pending_ || launches_in_flight_ > 0 || !connected()) return;
  synced_pending_ = false;
  send(protocol::Synced{});
}

void Agent::on_reconcile(const protocol::Reconcile& m) {
  std::vector<Key> orphaned;
  for (const auto& [key, job] : jobs_) {
    if (job.killing) continue;
    bool keep = std::find(m.keep.begin(), m.keep.end(), key) != m.keep.end();
    bool running = job.launching ||
                   std::any_of(job.ranks.begin(), job.ranks.end(), [](const auto& r) { return !r.second.exited; });
    if (!keep && (running || job.nccl_root.running() || job.probe_fd >= 0)) orphaned.push_back(key);
  }
  for (const auto& key : orphaned) {
    spdlog::warn("job {} attempt {} is no longer running on the coordinator: killing its ranks", key.first, key.second);
    kill_job(key, std::chrono::milliseconds(0));
  }
}

void Agent::on_prepare(const protocol::Prepare& m) {
  Key key{m.job, m.attempt};
  if (std::find(finished_.begin(), finished_.end(), key) != finished_.end()) return;  // over here
  if (auto it = jobs_.find(key);
      it != jobs_.end() && (!it->second.ranks.empty() || it->second.launching || it->second.killing)) {
    return;  // launched already: a Prepare sent again after a reconnect changes nothing
  }
  Job& job = jobs_[key];
  protocol::PrepareResult result{m.job, m.attempt, false, false, "", "", m.master_port};
  // Sent again (the first answer may have been lost): start over. A pending nccl-root
  // answer of the first one is dropped (its Prepare number is no longer the job's).
  release_job_resources(job);
  job.prepare = ++prepares_;
  auto held = hold_master_port(m.master_addr, m.master_port);
  if (!held) {
    result.port_busy = held.error().code() == ErrorCode::Conflict;
    return prepare_failed(key, std::move(result), held.error());
  }
  job.probe_fd = *held;
  if (!m.nccl) {
    result.ok = true;
    send(result);
    return;
  }
  // Started on the launch thread, as ranks are (its folder made, a fork): the job counts
  // as launching until it is back, so a kill meanwhile waits for the child to be held.
  job.launching = true;
  ++launches_in_flight_;
  offload(
      *launcher_,
      [worker = config_.worker, interface = interface_, dir = spool_.attempt_dir(m.job, m.attempt)] {
        std::error_code ec;
        fs::create_directories(dir, ec);
        return start_nccl_root(worker, interface, dir + "/nccl-root.log");
      },
      [this, key, prepare = job.prepare, result](const Result<NcclRootChild>& root) {
        on_nccl_root_started(key, prepare, result, root);
      });
}

void Agent::on_nccl_root_started(const Key& key, std::uint64_t prepare, protocol::PrepareResult result,
                                 const Result<NcclRootChild>& root) {
  --launches_in_flight_;
  auto it = jobs_.find(key);
  CORRAL_CHECK(it != jobs_.end());  // a launching job is never erased: kills wait for it
  Job& job = it->second;
  job.launching = false;
  if (root) {
    job.nccl_root.hold(*root);
    // It may have exited before it was held here: its exit was kept for it.
    if (auto e = unclaimed_exits_.find(root->pid); e != unclaimed_exits_.end()) {
      job.nccl_root.reaped(root->pid);
      unclaimed_exits_.erase(e);
    }
  }
  if (launches_in_flight_ == 0) unclaimed_exits_.clear();
  send_synced_when_ready();
  if (job.killing) {
    // Killed while it started: the root goes with the job (released with its resources).
    if (root) ::close(root->id_fd);
    return signal_ranks(key, job.kill_grace);
  }
  if (!root) return prepare_failed(key, std::move(result), root.error());
  offload(
      *work_,
      [fd = root->id_fd, log = root->log_path] { return read_nccl_root_id(fd, log, std::chrono::seconds(20)); },
      [this, key, prepare, result](const Result<std::string>& id) { on_nccl_root_answer(key, prepare, result, id); });
}

void Agent::on_nccl_root_answer(const Key& key, std::uint64_t prepare, protocol::PrepareResult result,
                                const Result<std::string>& id) {
  auto it = jobs_.find(key);
  // Killed meanwhile, or prepared again: this answer is for nobody.
  if (it == jobs_.end() || it->second.prepare != prepare || it->second.killing) return;
  if (!id) return prepare_failed(key, std::move(result), id.error());
  result.nccl_id = *id;
  result.ok = true;
  send(result);
}

void Agent::prepare_failed(const Key& key, protocol::PrepareResult result, const Error& why) {
  // The coordinator gives the attempt up and kills it everywhere; nothing of it is left
  // here to wait for that: what the Prepare held (the master port, nccl-root) goes now.
  result.error = why.message();
  send(result);
  if (auto it = jobs_.find(key); it != jobs_.end()) {
    release_job_resources(it->second);
    jobs_.erase(it);
  }
}

void Agent::on_launch(const protocol::Launch& m) {
  Key key{m.job, m.attempt};
  if (std::find(finished_.begin(), finished_.end(), key) != finished_.end()) {
    spdlog::warn("job {} attempt {} already ended on this node: not starting it again", m.job, m.attempt);
    return;
  }
  Job& job = jobs_[key];
  if (!job.ranks.empty() || job.launching || job.killing) return;  // a repeat after a reconnect
  job.launching = true;
  ++launches_in_flight_;
  // Check-ins are matched by address: watched when MASTER_ADDR is one (the agent's
  // advertise address), not for a host name.
  in6_addr any{};
  if (m.nccl_id.empty() && (::inet_pton(AF_INET, m.master_addr.c_str(), &any) == 1 ||
                            ::inet_pton(AF_INET6, m.master_addr.c_str(), &any) == 1)) {
    job.master_addr = m.master_addr;
    job.master_port = m.master_port;
  }
  job.hang_timeout = Duration(m.hang_timeout_ms);
  // Rank 0 binds the master port itself: the probe is closed just before it starts.
  int probe = -1;
  if (std::any_of(m.ranks.begin(), m.ranks.end(), [](const auto& r) { return r.rank == 0; })) {
    probe = job.probe_fd;
    job.probe_fd = -1;
  }
  StartContext context{spool_, interface_, agent_id_, config_.allow_root_jobs, {}};
  for (const auto& gpu : node_.gpus) context.gpu_uuids[gpu.index] = gpu.uuid;
  offload(
      *launcher_, [context = std::move(context), m, probe] { return start_ranks(context, m, probe); },
      [this, key](StartOutcome outcome) { on_started(key, std::move(outcome)); });
}

void Agent::on_started(const Key& key, StartOutcome outcome) {
  --launches_in_flight_;
  auto it = jobs_.find(key);
  CORRAL_CHECK(it != jobs_.end());  // a launching job is never erased: kills wait for it
  Job& job = it->second;
  job.launching = false;
  for (const auto& s : outcome.started) {
    job.ranks[s.rank] = Rank{s.rank, s.pid, false, false, false, s.log, s.gpus};
    job.gpu_uuids.insert(job.gpu_uuids.end(), s.gpu_uuids.begin(), s.gpu_uuids.end());
  }
  if (spool_health_.launch_failed(outcome.spool_problem)) {
    // Drained until a look at the spool finds room again (check_logs).
    spdlog::error("{}", spool_health_.error());
    send_health();
  }
  for (const auto& report : outcome.reports) {
    if (const auto* failed = std::get_if<protocol::RankExited>(&report); failed && failed->launch_failure) {
      if (!outcome.spool_problem.empty()) spool_health_.lost(key.first, key.second, failed->rank, failed->reason);
      spdlog::warn("job {} attempt {} rank {} cannot start here: {}", key.first, key.second, failed->rank,
                   failed->reason);
      report_end(*failed, Spool::marker_name(key.first, key.second, failed->rank));
      continue;
    }
    send(report);
  }
  // Ranks that exited before they were known here: reaped meanwhile, kept for them.
  std::vector<std::tuple<int, int, bool>> exited;  // (rank, status, group gone)
  for (const auto& s : outcome.started) {
    if (auto e = unclaimed_exits_.find(s.pid); e != unclaimed_exits_.end()) {
      exited.emplace_back(s.rank, e->second.first, e->second.second);
      unclaimed_exits_.erase(e);
    }
  }
  if (launches_in_flight_ == 0) unclaimed_exits_.clear();
  send_synced_when_ready();
  if (job.ranks.empty()) {
    // None started (launch failures, or ranks started here before): confirm that nothing
    // of the attempt runs here, as for an attempt whose ranks ended.
    job.killing = true;
    finish_kill(key);
    return;
  }
  if (job.killing) signal_ranks(key, job.kill_grace);  // a kill came while starting
  for (const auto& [rank, status, group_gone] : exited) {
    auto j = jobs_.find(key);
    if (j == jobs_.end()) break;
    auto r = j->second.ranks.find(rank);
    if (r != j->second.ranks.end() && !r->second.exited) rank_done(key, r->second, status, group_gone);
  }
  reap();
}

void Agent::reap() {
  // The agent is a child subreaper: ranks' orphaned children come back to it and are
  // reaped here too, so no zombie lingers in a job's process group. Children that a
  // command on a BlockingWork thread started are that thread's to reap: the first such
  // zombie ends this pass, and the command's result, when it comes back, reaps again.
  std::map<pid_t, std::pair<Key, int>> ranks;
  for (auto& [key, job] : jobs_) {
    for (auto& [r, rank] : job.ranks) {
      if (!rank.exited) ranks[rank.pid] = {key, r};
    }
  }
  for (;;) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
    pid_t pid = info.si_pid;
    if (run_command_owns(pid)) break;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) != pid) continue;
    if (auto it = ranks.find(pid); it != ranks.end()) {
      auto job = jobs_.find(it->second.first);
      if (job != jobs_.end()) rank_done(it->second.first, job->second.ranks[it->second.second], status);
      continue;
    }
    bool known = false;
    for (auto& [key, job] : jobs_) {
      known = job.nccl_root.reaped(pid) || known;
    }
    // A rank that exited before its launch came back from the launch thread.
    if (!known && launches_in_flight_ > 0) unclaimed_exits_[pid] = {status, !group_alive(pid)};
  }
}

void Agent::rank_done(const Key& key, Rank& rank, int status, bool group_gone) {
  rank.exited = true;
  // Whatever the rank left behind in its group (data loader workers, shells) goes too;
  // a group seen empty since the reap is let go (its id may be reused).
  if (!group_gone) signal_group(rank.pid, SIGKILL);
  rank.group_gone = group_gone || !group_alive(rank.pid);
  spool_health_.check_once(rank.log);
  protocol::RankExited m{key.first, key.second, rank.rank, 0, 0, describe_status(status), false};
  if (WIFEXITED(status)) m.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) m.signal = WTERMSIG(status);
  // Logged once kept on disk: a line that says how a rank ended is never lost by a kill.
  report_end(m, Spool::marker_name(key.first, key.second, rank.rank));
  spdlog::info("job {} rank {} {}", key.first, rank.rank, m.reason);
  Job& job = jobs_[key];
  bool all = std::all_of(job.ranks.begin(), job.ranks.end(), [](const auto& r) { return r.second.exited; });
  if (job.escalation) job.escalation->exited(rank.rank);
  if (all) {
    // Whether they ended by themselves or were killed: make sure nothing of the attempt is
    // left on the node, then say so (AttemptGone), which frees its GPUs and port.
    job.killing = true;
    finish_kill(key);
  }
}

void Agent::release_job_resources(Job& job) {
  if (job.probe_fd >= 0) {
    ::close(job.probe_fd);
    job.probe_fd = -1;
  }
  job.nccl_root.release();
}

void Agent::on_kill(const protocol::Kill& m) {
  Key key{m.job, m.attempt};
  if (!jobs_.contains(key)) {
    // Never run here, already ended, or left by an earlier agent process: look for what
    // may be left of it all the same, and answer.
    jobs_[key].killing = true;
    finish_kill(key);
    return;
  }
  kill_job(key, std::chrono::milliseconds(m.grace_ms));
}

void Agent::kill_job(const Key& key, Duration grace) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.killing) return;
  job.killing = true;
  if (job.launching) {
    job.kill_grace = grace;  // on_started sends the signals once the ranks are known
    return;
  }
  signal_ranks(key, grace);
}

void Agent::signal_ranks(const Key& key, Duration grace) {
  Job& job = jobs_.at(key);
  std::map<int, pid_t> running;
  for (const auto& [r, rank] : job.ranks) {
    if (!rank.exited) running[r] = rank.pid;
  }
  if (!job.escalation) {
    job.escalation = std::make_unique<KillEscalation>(
        loop_, "job " + std::to_string(key.first) + " attempt " + std::to_string(key.second));
  }
  // Each rank's reaping goes on with the kill; with none left to signal, it goes on now.
  if (!job.escalation->start(running, grace)) finish_kill(key);
}

void Agent::finish_kill(const Key& key) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  release_job_resources(job);
  // One sweep at a time: it looks again until nothing is left.
  if (job.sweep) return;
  SweepTarget target{key.first, key.second, agent_id_, {}};
  for (const auto& [r, rank] : job.ranks) {
    if (!rank.group_gone) target.groups.push_back(rank.pid);
  }
  if (job.nccl_root.group() != 0) target.groups.push_back(job.nccl_root.group());
  job.sweep = std::make_unique<AttemptSweep>(
      loop_, *work_, std::move(target), [this] { reap(); },
      [this, key](const std::string& left) { on_swept(key, left); });
  job.sweep->start();
}

void Agent::on_swept(const Key& key, const std::string& left) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (!left.empty()) {
    // Not confirmed: the coordinator keeps the attempt's GPUs and port fenced.
    health_error_ = "processes of job " + std::to_string(key.first) + " survived SIGKILL (" + left + ")";
    spdlog::error("{}", health_error_);
    send_health();
    remember_finished(key);
    jobs_.erase(it);
    return;
  }
  // Confirmed dead; its GPUs go back only once nothing else holds them either (a process
  // that left the job's groups and environment, or a CUDA context the driver has not torn
  // down yet). A leftover attempt's GPUs come from its markers: no survey needed.
  if (!hooks_.compute_apps || job.gpu_uuids.empty()) return attempt_gone(key, std::vector<std::string>{});
  offload(
      *work_,
      [apps = hooks_.compute_apps, uuids = job.gpu_uuids]() -> Result<std::vector<std::string>> {
        auto listed = apps();
        if (!listed) return std::unexpected(listed.error());
        return gpus_still_held(*listed, uuids);
      },
      [this, key](const Result<std::vector<std::string>>& held) { attempt_gone(key, held); });
}

void Agent::attempt_gone(const Key& key, const Result<std::vector<std::string>>& gpus_held) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  // A GPU that may still be held is not handed to another job: the node drains, whether
  // a process was seen on it or the driver could not be asked.
  std::string problem;
  if (!gpus_held) {
    problem = "cannot tell whether the GPUs of job " + std::to_string(key.first) +
              " are free after it was killed: " + gpus_held.error().message();
  } else if (!gpus_held->empty()) {
    for (const auto& h : *gpus_held) problem += (problem.empty() ? "" : "; ") + h;
    problem = "GPU still in use after job " + std::to_string(key.first) + " was killed: " + problem;
  }
  if (!problem.empty()) {
    health_error_ = std::move(problem);
    spdlog::error("{}", health_error_);
    send_health();
  }
  remember_finished(key);
  jobs_.erase(it);
  send(protocol::AttemptGone{key.first, key.second});
}

void Agent::remember_finished(const Key& key) {
  // A Launch that arrives after its attempt ended here (repeated, or overtaken by a Kill)
  // must not start it again. Attempts end at most a few per second: a window of recent
  // ones is enough.
  constexpr std::size_t kRemembered = 4096;
  if (std::find(finished_.begin(), finished_.end(), key) != finished_.end()) return;
  finished_.push_back(key);
  if (finished_.size() > kRemembered) finished_.pop_front();
}

void Agent::on_log_request(const protocol::LogRequest& m) {
  auto it = jobs_.find({m.job, m.attempt});
  // A rank being started (its log may already exist, empty) is not finished either.
  bool running = it != jobs_.end() && (it->second.launching || (it->second.ranks.contains(m.rank) &&
                                                                !it->second.ranks.at(m.rank).exited));
  // Read on its own thread, in the order asked, whatever the other work waits for.
  std::string lost = spool_health_.lost_why(m.job, m.attempt, m.rank);
  logs_->run([m, path = spool_.log_path(m.job, m.attempt, m.rank), running,
              lost = std::move(lost)] { return answer_log_request(m, path, running, lost); },
             [this](const protocol::LogData& d) { send(d); });
}

void Agent::let_go_of_empty_groups() {
  // A group whose leader was reaped keeps its id only while a process is in it. Looked at
  // every watch, so that an id is let go long before the pids could wrap round to it.
  for (auto& [key, job] : jobs_) {
    for (auto& [r, rank] : job.ranks) {
      if (rank.exited && !rank.group_gone && !group_alive(rank.pid)) rank.group_gone = true;
    }
    job.nccl_root.let_go_if_empty();
  }
}

void Agent::watch_ranks() {
  let_go_of_empty_groups();
  if (watch_running_) return;  // the last look is still going
  ++watch_count_;
  const bool sample = watch_count_ % kHangSampleEvery == 0;
  const bool gpu_check = watch_count_ % kGpuCheckEvery == 0 && hooks_.compute_apps && !gpu_check_running_;
  struct Look {
    Key key;
    std::string master_addr;
    int master_port = 0;
    std::vector<WatchedRank> joining;  // not checked in yet
    std::vector<WatchedRank> sampled;  // whose progress is watched
  };
  std::vector<Look> looks;
  std::vector<std::pair<Key, std::vector<std::pair<WatchedRank, std::vector<int>>>>> on_gpus;  // with their GPUs
  // Asked of nvidia-smi (tens of ms of CPU; seconds where the driver is not kept loaded)
  // only while a watched rank on GPUs is idle on the CPU: a rank that computes there makes
  // progress whatever its GPUs do.
  bool utilization = false;
  for (auto& [key, job] : jobs_) {
    if (job.killing) continue;
    Look look{key, job.master_addr, job.master_port, {}, {}};
    std::vector<std::pair<WatchedRank, std::vector<int>>> mine;
    for (auto& [r, rank] : job.ranks) {
      if (rank.exited) continue;
      if (!job.master_addr.empty() && !rank.joined &&
          (rank.join_looks++ < kEagerJoinLooks || watch_count_ % kLateJoinEvery == 0)) {
        look.joining.push_back({r, rank.pid});
      }
      if (sample && job.hang_timeout.count() > 0) {
        look.sampled.push_back({r, rank.pid});
        utilization = utilization || (rank.progress.cpu_idle() && !rank.gpus.empty());
      }
      if (gpu_check && !rank.gpus.empty()) mine.push_back({{r, rank.pid}, rank.gpus});
    }
    if (!look.joining.empty() || !look.sampled.empty()) looks.push_back(std::move(look));
    if (!mine.empty()) on_gpus.emplace_back(key, std::move(mine));
  }
  // What nvidia-smi answers is read beside the looks, each on its own: a driver slow to
  // answer (nvidia-smi waits up to its timeout) holds up neither the check-ins nor the
  // samples. The GPUs' utilization serves the samples for kGpuUtilizationServes.
  if (utilization && hooks_.gpu_utilization && !gpu_busy_reading_ &&
      CpuProgress::Clock::now() - gpu_busy_at_ >= kGpuUtilizationServes) {
    gpu_busy_reading_ = true;
    offload(
        *work_, [hook = hooks_.gpu_utilization] { return hook(); },
        [this](const Result<std::map<int, int>>& busy) {
          gpu_busy_reading_ = false;
          if (!busy) spdlog::warn("cannot read the GPUs' utilization: {}", busy.error().message());
          gpu_busy_ = busy.value_or(std::map<int, int>{});
          gpu_busy_at_ = CpuProgress::Clock::now();
        });
  }
  if (!on_gpus.empty()) check_gpu_use(std::move(on_gpus));
  if (looks.empty()) return;
  watch_running_ = true;
  struct Seen {
    std::vector<std::pair<Key, int>> joined;
    std::vector<std::pair<Key, protocol::RankProcess>> sampled;
    CpuProgress::Clock::time_point at;
  };
  offload(
      *work_,
      [looks = std::move(looks)] {
        Seen seen;
        for (const auto& look : looks) {
          if (!look.joining.empty()) {
            for (int rank : joined_ranks(look.joining, look.master_addr, look.master_port)) {
              seen.joined.emplace_back(look.key, rank);
            }
          }
          for (auto& p : inspect_ranks(look.sampled)) seen.sampled.emplace_back(look.key, std::move(p));
        }
        seen.at = CpuProgress::Clock::now();
        return seen;
      },
      [this](const Seen& seen) {
        watch_running_ = false;
        for (const auto& [key, r] : seen.joined) mark_joined(key, r);
        // A reading older than it serves (nobody idled on the CPU meanwhile) says nothing;
        // while the next one is being read, a rank on GPUs is not judged (its CPU time
        // counts at the next sample all the same): idle GPUs are not assumed.
        static const std::map<int, int> kNone;
        const bool fresh = seen.at - gpu_busy_at_ <= kGpuUtilizationServes + std::chrono::seconds(1);
        const auto& busy = fresh ? gpu_busy_ : kNone;
        for (const auto& [key, p] : seen.sampled) {
          auto [job, rank] = running_rank(key, p.rank);
          if (rank == nullptr || !p.alive) continue;
          if (!fresh && gpu_busy_reading_ && !rank->gpus.empty()) continue;
          bool gpu_busy = std::any_of(rank->gpus.begin(), rank->gpus.end(), [&](int g) {
            auto u = busy.find(g);
            return u != busy.end() && u->second > 0;
          });
          auto change = rank->progress.sample(seen.at, p.cpu_ms, job->hang_timeout, gpu_busy);
          if (change == CpuProgress::Change::None) continue;
          bool stalled = change == CpuProgress::Change::Stalled;
          rank->stalled_state = p.state;
          send(protocol::RankStall{key.first, key.second, p.rank, stalled, rank->progress.idle(seen.at).count(), p.state});
        }
      });
}

void Agent::check_gpu_use(std::vector<std::pair<Key, std::vector<std::pair<WatchedRank, std::vector<int>>>>> on_gpus) {
  gpu_check_running_ = true;
  using Misuse = std::vector<std::pair<Key, std::pair<int, GpuMisuse>>>;
  offload(
      *work_,
      [on_gpus = std::move(on_gpus), apps_hook = hooks_.compute_apps, gpus = node_.gpus] {
        Misuse found;
        auto apps = apps_hook();
        if (!apps) spdlog::warn("cannot check the ranks' GPUs: {}", apps.error().message());
        if (!apps || apps->empty()) return found;
        for (const auto& [key, ranks_on_gpus] : on_gpus) {
          std::vector<pid_t> groups;
          for (const auto& [r, own] : ranks_on_gpus) groups.push_back(r.group);
          auto members = group_members(groups);
          std::vector<RankOnGpus> ranks;
          for (const auto& [r, own] : ranks_on_gpus) {
            RankOnGpus rank{r.rank, {}, own};
            for (const auto& p : members[r.group]) rank.processes[p.pid] = p.comm;
            ranks.push_back(std::move(rank));
          }
          for (auto& [rank, misuse] : find_gpu_misuse(ranks, *apps, gpus)) {
            found.emplace_back(key, std::pair{rank, std::move(misuse)});
          }
        }
        return found;
      },
      [this](const Misuse& found) {
        gpu_check_running_ = false;
        for (const auto& [key, misuse] : found) {
          auto [job, rank] = running_rank(key, misuse.first);
          // Once per rank and GPU: a program that starts new processes keeps its warning.
          if (rank == nullptr || !rank->warned.insert("gpu " + std::to_string(misuse.second.gpu)).second) continue;
          spdlog::warn("job {} rank {}: {}", key.first, misuse.first, misuse.second.text);
          send(protocol::RankWarning{key.first, key.second, misuse.first, misuse.second.text});
        }
      });
}

std::pair<Agent::Job*, Agent::Rank*> Agent::running_rank(const Key& key, int r) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return {nullptr, nullptr};
  auto rank = it->second.ranks.find(r);
  if (rank == it->second.ranks.end() || rank->second.exited) return {nullptr, nullptr};
  return {&it->second, &rank->second};
}

std::vector<WatchedRank> Agent::watched(const Key& key, const std::vector<int>& ranks) const {
  std::vector<WatchedRank> out;
  auto it = jobs_.find(key);
  for (int r : ranks) {
    pid_t group = 0;
    if (it != jobs_.end()) {
      auto rank = it->second.ranks.find(r);
      if (rank != it->second.ranks.end() && !rank->second.exited) group = rank->second.pid;
    }
    out.push_back({r, group});
  }
  return out;
}

void Agent::mark_joined(const Key& key, int r) {
  auto job = jobs_.find(key);
  if (job == jobs_.end()) return;
  auto rank = job->second.ranks.find(r);
  if (rank == job->second.ranks.end() || rank->second.exited || rank->second.joined) return;
  rank->second.joined = true;
  send(protocol::RankJoined{key.first, key.second, r});
}

void Agent::on_inspect(const protocol::Inspect& m) {
  Key key{m.job, m.attempt};
  std::vector<WatchedRank> ranks = watched(key, m.ranks);
  // Looked for once more: the watch may be a second behind.
  std::vector<WatchedRank> joining;
  std::string master_addr;
  int master_port = 0;
  if (auto it = jobs_.find(key); it != jobs_.end() && !it->second.master_addr.empty()) {
    master_addr = it->second.master_addr;
    master_port = it->second.master_port;
    for (const auto& r : ranks) {
      if (r.group != 0 && !it->second.ranks.at(r.rank).joined) joining.push_back(r);
    }
  }
  struct Found {
    std::vector<int> joined;
    std::vector<protocol::RankProcess> ranks;
  };
  offload(
      *work_,
      [ranks = std::move(ranks), joining = std::move(joining), master_addr, master_port] {
        Found found;
        if (!joining.empty()) found.joined = joined_ranks(joining, master_addr, master_port);
        found.ranks = inspect_ranks(ranks);
        return found;
      },
      [this, key](const Found& found) {
        // Check-ins first: the coordinator judges on the Inspection that follows.
        for (int r : found.joined) mark_joined(key, r);
        send(protocol::Inspection{key.first, key.second, found.ranks});
      });
}

void Agent::on_stack_request(const protocol::StackRequest& m) {
  std::vector<WatchedRank> ranks = watched({m.job, m.attempt}, m.ranks);
  if (stacks_waiting_ >= kMaxStackRequests) {
    protocol::Stacks busy{m.request, {}};
    for (const auto& r : ranks) {
      busy.ranks.push_back({r.rank, "this node is still gathering " + std::to_string(stacks_waiting_) +
                                        " earlier stack requests: ask again later\n"});
    }
    send(busy);
    return;
  }
  ++stacks_waiting_;
  const char* path = std::getenv("PATH");
  StackTools tools = find_stack_tools(path != nullptr ? path : "/usr/bin:/bin");
  offload(
      *stacks_,
      [ranks = std::move(ranks), tools, request = m.request] {
        // Within one message (8 MiB), each rank's report within its share.
        const std::size_t share =
            std::min<std::size_t>(protocol::kMaxStackReportBytes, (7u << 20) / std::max<std::size_t>(1, ranks.size()));
        protocol::Stacks out{request, {}};
        for (const auto& r : ranks) {
          std::string report = rank_stack_report(r.group, tools);
          // encode() replaces bytes that are not UTF-8 (up to 3 bytes for 1): cut at a
          // third of the share so the replaced text still fits.
          const std::size_t cut = share / 3 - 64;
          if (report.size() > cut) {
            report.resize(cut);
            report += "\n[cut at " + std::to_string(cut) + " bytes]\n";
          }
          out.ranks.push_back({r.rank, std::move(report)});
        }
        return out;
      },
      [this](const protocol::Stacks& stacks) {
        --stacks_waiting_;
        send(stacks);
      });
}

void Agent::run_preflight() {
  if (preflight_running_) return;  // a slow one is still running: it reports when done
  preflight_running_ = true;
  offload(*work_, [check = hooks_.preflight, expected = node_.gpus.size()] { return check(expected); },
          [this](const std::string& error) {
    preflight_running_ = false;
    if (error == health_error_) return;
    health_error_ = error;
    send_health();
  });
}

std::string Agent::node_health() const {
  const std::string& spool = spool_health_.error();
  if (spool.empty()) return health_error_;
  return health_error_.empty() ? spool : health_error_ + "; " + spool;
}

void Agent::send_health() { send(protocol::Health{node_health()}); }

void Agent::check_logs() {
  if (!spool_health_.begin_look()) return;  // the last look is still going
  std::vector<std::tuple<Key, int>> ranks;  // running: told when their output may be lost
  std::vector<std::string> logs = spool_health_.take_check_once();
  for (const auto& [key, job] : jobs_) {
    for (const auto& [r, rank] : job.ranks) {
      if (rank.exited) continue;
      ranks.emplace_back(key, r);
      logs.push_back(rank.log);
    }
  }
  offload(
      *work_,
      [logs = std::move(logs), cap = config_.rank_log_cap, spool = spool_] {
        std::string problem = cap_logs(logs, cap);
        return problem.empty() ? spool.full() : problem;
      },
      [this, ranks = std::move(ranks)](const std::string& problem) { on_logs_checked(ranks, problem); });
}

void Agent::on_logs_checked(const std::vector<std::tuple<Key, int>>& ranks, const std::string& problem) {
  spool_health_.end_look();
  if (!problem.empty()) {
    // What the ranks running now wrote may not have reached their logs: said on the job
    // and by corral logs, so that a job is never taken for complete with its output lost.
    for (const auto& [key, r] : ranks) {
      spool_health_.lost(key.first, key.second, r, "the spool could not take writes while the rank ran (" + problem + ")");
      auto [job, rank] = running_rank(key, r);
      if (rank != nullptr && rank->warned.insert("log lost").second) {
        send(protocol::RankWarning{key.first, key.second, r, "its log may have lost output: " + problem});
      }
    }
  }
  if (!spool_health_.looked(problem)) return;
  if (!spool_health_.error().empty()) spdlog::error("{}", spool_health_.error());
  else spdlog::info("the spool takes rank logs again");
  send_health();
}

}  // namespace corral::agent
