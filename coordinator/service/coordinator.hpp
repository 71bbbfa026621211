#pragma once
// Coordinator: the cluster's brain as a service. It decodes HTTP requests and agent
// messages, feeds the pure scheduler, persists every decision through the Committer,
// and only then answers and sends (persist, send, log). Lives entirely on the event
// loop's thread; the only blocking work is the SQLite commit at the end of a turn.

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/core/time.hpp"
#include "common/model/config.hpp"
#include "common/model/job_spec.hpp"
#include "common/net/event_loop.hpp"
#include "common/net/server.hpp"
#include "common/protocol/messages.hpp"
#include "coordinator/sched/scheduler.hpp"
#include "coordinator/service/committer.hpp"
#include "coordinator/store/store.hpp"

namespace corral::service {

struct CoordinatorStats {
  std::uint64_t submitted = 0;
  std::uint64_t ended[model::kJobStateCount] = {};  // by JobState
  std::uint64_t passes = 0;
  double last_pass_ms = 0;
  std::uint64_t agent_messages = 0;
  std::uint64_t bad_agent_messages = 0;
  std::uint64_t http_requests = 0;
};

class Coordinator final : public net::ServerHandler {
 public:
  Coordinator(net::EventLoop& loop, const Clock& clock, store::Store& store, model::CoordinatorConfig config);
  ~Coordinator() override;

  // Reloads state from the store and starts the timers. Jobs that were running wait
  // `reconnect_grace` for their agents to report them.
  Result<void> start();
  // Commits what is queued; call before the loop stops.
  void shutdown();

  // net::ServerHandler
  void on_http(const net::HttpRequest& request, std::function<void(net::HttpResponse)> respond) override;
  Result<void> accept_ws(const net::HttpRequest& request) override;
  void on_ws_open(const std::shared_ptr<net::WsConnection>& conn) override;
  void on_ws_message(const std::shared_ptr<net::WsConnection>& conn, std::string text) override;
  void on_ws_close(const std::shared_ptr<net::WsConnection>& conn) override;

  const CoordinatorStats& stats() const { return stats_; }
  bool in_grace() const { return in_grace_; }

 private:
  // A node's agent link and what it last told us.
  struct Link {
    std::shared_ptr<net::WsConnection> conn;
    bool connected = false;
    TimePoint last_seen{};
    std::string driver;
    model::CudaVersion cuda;
    std::vector<protocol::RunningRank> reported;  // from its last Hello
    bool lost = false;                            // declared gone (its jobs lost) since its last Hello
    // Counts Hellos: a message sent on an older connection may never have arrived.
    std::uint64_t generation = 0;
    // Synced since its last Hello: every report it held back has been applied.
    bool synced = false;
  };
  // A job that is not over (or only just over), with its spec parsed.
  struct Job {
    store::JobRecord record;
    model::JobSpec spec;
    // Per node, the link generation on which this attempt's Launch went out: a rank that
    // its agent has not reported after Synced is only lost if the Launch went out on an
    // earlier connection (or before a restart of ours).
    std::map<std::string, std::uint64_t> launched_on;
  };
  struct JobWait {
    std::function<void(net::HttpResponse)> respond;
    TimePoint deadline{};
  };
  struct LogWait {
    std::function<void(net::HttpResponse)> respond;
    int rank = 0;
    std::string node;
    TimePoint deadline{};
  };

  // ---- jobs and decisions (coordinator.cpp)
  void request_pass();
  void run_pass();
  void apply(const std::vector<sched::Decision>& decisions);
  void apply_change(const sched::JobChange& change);
  void persist_job(const Job& job, std::string event_text);
  void send_prepare(const Job& job);
  void send_launch(Job& job);
  void tick();
  void end_grace();
  bool all_running_nodes_synced() const;
  // Feeds a scheduler event about a live job and applies the decisions.
  void job_event(model::JobId id, int attempt, sched::JobEvent event, const sched::EventInfo& info = {});
  std::vector<store::RankRecord> rank_records(const model::JobSpec& spec, const model::Allocation& alloc) const;
  Job* live_job(model::JobId id);
  Job* any_job(model::JobId id);
  void remember_ended(Job job);
  void fatal(const Error& error);

  // ---- agents (agents.cpp)
  void send(const std::string& node, const protocol::CoordinatorMessage& message);
  void on_hello(const std::shared_ptr<net::WsConnection>& conn, protocol::Hello hello);
  void on_health(const std::string& node, const protocol::Health& health);
  void on_prepare_result(const std::string& node, const protocol::PrepareResult& m);
  store::RankRecord* own_rank(Job* job, const std::string& node, int attempt, int rank);
  void on_rank_started(const std::string& node, const protocol::RankStarted& m);
  void on_rank_exited(const std::string& node, const protocol::RankExited& m);
  void on_log_data(const std::string& node, const protocol::LogData& m);
  void on_synced(const std::string& node);
  void on_attempt_gone(const std::string& node, const protocol::AttemptGone& m);
  // Records that no process of the job's attempt is left on `node`; RanksGone once that
  // holds on every node. `why` goes to the event log.
  void confirm_gone(Job& job, const std::string& node, const std::string& why);
  // Frees the nodes of an ENDING job whose ranks are all confirmed gone; RanksGone when
  // every node is.
  void settle_ending(Job& job);
  // The record that holds job `id`'s fences: a live job's, or an ended one's.
  store::JobRecord* fence_owner(model::JobId id);
  // Frees the fence of (job, attempt) on `node`; `why` goes to the event log.
  void lift_fence(model::JobId id, int attempt, const std::string& node, const std::string& why);
  bool agent_lost(const std::string& node) const;
  // Kill to `node` for every ENDING job whose ranks there are not confirmed gone.
  void kill_unconfirmed(const std::string& node);
  void reconcile(const std::string& node);
  void node_changed(const model::Node& node, const std::vector<sched::Decision>& decisions);
  void node_lost(const std::string& name, const std::string& reason, TimePoint now);

  // ---- HTTP (api.cpp)
  struct Caller {
    std::string user;
    bool admin = false;
  };
  Result<Caller> authenticate(const net::HttpRequest& request);
  void route(const net::HttpRequest& request, const Caller& caller, std::function<void(net::HttpResponse)> respond);
  void submit(const net::HttpRequest& request, const Caller& caller, std::function<void(net::HttpResponse)> respond);
  // Answers once everything queued so far (the change this response reports) is durable.
  void after_commit(net::HttpResponse response, std::function<void(net::HttpResponse)> respond);
  net::HttpResponse list_jobs(const net::HttpRequest& request);
  net::HttpResponse show_job(model::JobId id);
  // GET /v1/jobs/ID?wait=S: answers when the job ends (after that is durable) or S
  // seconds have passed, whichever is first; the caller then sees the state either way.
  void wait_job(model::JobId id, const net::HttpRequest& request, std::function<void(net::HttpResponse)> respond);
  void answer_job_waits(model::JobId id);
  net::HttpResponse cancel_job(model::JobId id, const Caller& caller);
  void job_logs(model::JobId id, const net::HttpRequest& request, const Caller& caller,
                std::function<void(net::HttpResponse)> respond);
  net::HttpResponse list_nodes();
  net::HttpResponse drain_node(const std::string& name, const net::HttpRequest& request, bool drain);
  // An admin says the node's unconfirmed ranks are dead (the node will not come back).
  net::HttpResponse clear_node(const std::string& name, const Caller& caller);
  net::HttpResponse metrics();
  net::HttpResponse status_page();

  net::EventLoop& loop_;
  const Clock& clock_;
  store::Store& store_;
  model::CoordinatorConfig config_;
  sched::Scheduler scheduler_;
  Committer committer_;
  std::map<std::string, Link> links_;
  std::unordered_map<model::JobId, Job> jobs_;   // live jobs
  std::map<model::JobId, Job> ended_;            // recently ended, for late rank reports
  // Ended jobs whose earlier attempts still hold fences (live jobs keep theirs in jobs_).
  std::map<model::JobId, Job> fenced_;
  std::deque<model::JobId> ended_order_;
  struct CachedUser {
    store::User user;
    TimePoint checked{};
  };
  // By token hash; an entry is checked against the database again after
  // kTokenRecheck, so a token replaced by `add-user` stops working without a restart.
  static constexpr Duration kTokenRecheck = std::chrono::seconds(5);
  std::unordered_map<std::string, CachedUser> users_;
  std::map<std::uint64_t, LogWait> log_waits_;
  std::multimap<model::JobId, JobWait> job_waits_;
  std::uint64_t next_log_request_ = 1;
  model::JobId max_job_id_ = 0;
  bool pass_posted_ = false;
  bool in_grace_ = false;
  TimePoint grace_ends_{};
  TimePoint last_periodic_pass_{};
  std::unique_ptr<net::Timer> tick_timer_;
  std::unique_ptr<net::Timer> pass_timer_;
  std::chrono::steady_clock::time_point last_pass_end_{};
  std::chrono::steady_clock::duration last_pass_took_{};
  CoordinatorStats stats_;
};

}  // namespace corral::service
