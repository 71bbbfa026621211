#pragma once
// Coordinator: the cluster's brain as a service, on one event-loop thread. It decodes
// HTTP requests and agent messages and hands them to the Ledger, the one writer of job
// and rank state; it commits the ledger's effects through the Committer and only then
// answers and sends (persist, send, log). It owns what the ledger must not: sockets,
// timers, the token cache, parked waits and log requests. What blocks on the loop is the
// SQLite commit at the end of a turn and lookups of one row by its key (a token, an ended
// job); history and usage, scans that may take seconds, are read on a thread of their own.

#include <map>
#include <set>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/core/time.hpp"
#include "common/model/config.hpp"
#include "common/net/blocking_work.hpp"
#include "common/net/event_loop.hpp"
#include "common/net/server.hpp"
#include "common/protocol/messages.hpp"
#include "coordinator/ledger/ledger.hpp"
#include "coordinator/service/committer.hpp"
#include "coordinator/service/submit_keys.hpp"
#include "coordinator/store/store.hpp"

namespace corral::service {

struct CoordinatorStats {
  std::uint64_t passes = 0;
  double last_pass_ms = 0;
  std::uint64_t agent_messages = 0;
  std::uint64_t bad_agent_messages = 0;
  std::uint64_t http_requests = 0;
  std::uint64_t store_failures = 0;  // times the database began refusing writes
};

// Which jobs a list or a bulk cancel is about: every condition given must hold; an empty
// set does not filter.
struct JobFilter {
  std::set<std::string> users;
  std::set<model::JobState> states;
  bool matches(const store::JobRecord& rec) const;
  // States were named and none of them is terminal.
  bool live_only() const;
};
// `user` names and `state` names (any case, or Slurm's short codes: PD, R, CG, CD, F, CA,
// TO, NF); InvalidArgument naming the field otherwise.
Result<JobFilter> parse_job_filter(const std::vector<std::string>& users, const std::vector<std::string>& states);

class NodeListing;
struct NodeView;

class Coordinator final : public net::ServerHandler {
 public:
  // `cluster`: this cluster's identity (cluster_identity.hpp), told to every agent.
  Coordinator(net::EventLoop& loop, const Clock& clock, store::Store& store, model::CoordinatorConfig config,
              std::string cluster = "");
  ~Coordinator() override;

  // Reloads state from the store and starts the timers. Jobs that were running wait
  // `reconnect_grace` for their agents to report them.
  Result<void> start();
  // Commits what is queued; call before the loop stops.
  void shutdown();
  // A change was refused for good and the loop was stopped: the process must exit with
  // a failure, so that it is restarted and reloads the truth.
  bool failed() const { return failed_; }
  // Where GET /v1/history and /v1/usage read ended jobs: a second connection to the same
  // database, used on a thread of its own, so that a month of history (seconds to read
  // and render) never holds the loop. Without one (a MemoryStore in tests) they read the
  // store on the loop.
  void read_history_from(std::shared_ptr<store::Store> reader);

  // net::ServerHandler
  void on_http(const net::HttpRequest& request, std::function<void(net::HttpResponse)> respond) override;
  Result<void> accept_ws(const net::HttpRequest& request) override;
  void on_ws_open(const std::shared_ptr<net::WsConnection>& conn) override;
  void on_ws_message(const std::shared_ptr<net::WsConnection>& conn, std::string text) override;
  void on_ws_close(const std::shared_ptr<net::WsConnection>& conn) override;

  const CoordinatorStats& stats() const { return stats_; }
  bool in_grace() const { return ledger_.in_grace(); }

 private:
  using Respond = std::function<void(net::HttpResponse)>;
  using Job = ledger::Ledger::Job;
  struct JobWait {
    Respond respond;
    Instant deadline{};
  };
  struct LogWait {
    Respond respond;
    int rank = 0;
    std::string node;
    Instant deadline{};
  };

  // corral stack: the agents asked, and each rank's report so far (node, text; empty
  // until its agent answers).
  struct StackWait {
    Respond respond;
    model::JobId job = 0;
    std::set<std::string> asked;
    std::map<int, std::pair<std::string, std::string>> reports;
    Instant deadline{};
  };
  // gdb on every process of every rank of a node takes a while.
  static constexpr Duration kStackAnswerTime = std::chrono::seconds(25);  // under the CLI's 30 s

  // ---- the ledger's effects, and time (coordinator.cpp)
  // How the ledger learns the end state of a job it no longer holds: from the store.
  ledger::Ledger::EndedLookup ended_lookup();
  // Commits what the ledger changed; then sends its messages and answers waits.
  void flush_effects();
  void request_pass();
  void run_pass();
  void tick();
  void fatal(const Error& error);
  void store_state_changed(const Error* failing);
  bool retries_held_submit(const net::HttpRequest& request, const std::string& user) const;
  void send(const std::string& node, const protocol::CoordinatorMessage& message);
  void on_log_data(const std::string& node, const protocol::LogData& m);
  void on_stacks(const std::string& node, const protocol::Stacks& m);

  // ---- HTTP (api.cpp)
  struct Caller {
    std::string user;
    bool admin = false;
    std::string token_hash;
  };
  Result<Caller> authenticate(const net::HttpRequest& request);
  // Who holds the token with this hash: from the cache while its entry is younger than
  // kTokenRecheck, else from the database; nullopt for a token that is gone.
  Result<std::optional<Caller>> caller_for(const std::string& token_hash);
  void route(const net::HttpRequest& request, const Caller& caller, Respond respond);
  void submit(const net::HttpRequest& request, const Caller& caller, Respond respond);
  // "42", or "42_7" (element 7 of array 42). InvalidArgument; NotFound for an element
  // that does not exist.
  Result<model::JobId> resolve_job_ref(std::string_view text);
  // Answers once everything queued so far (the change this response reports) is durable.
  void after_commit(net::HttpResponse response, Respond respond);
  // GET /v1/jobs[?all=1][&user=a,b][&state=S,...][&me=1]
  net::HttpResponse list_jobs(const net::HttpRequest& request, const Caller& caller);
  // With a caller who owns the job (or an admin), its spec's text too; a job private
  // from the caller (private_data: jobs) is 404, as one that does not exist.
  net::HttpResponse show_job(model::JobId id, const Caller* caller = nullptr);
  struct TimeRange {
    TimePoint since{};
    std::optional<TimePoint> until;
  };
  // `since` (default: a day ago) and `until` of a history or usage request.
  Result<TimeRange> time_range(const net::HttpRequest& request);
  // GET /v1/history: ended jobs from the database, like sacct.
  void history(const net::HttpRequest& request, const Caller& caller, Respond respond);
  // GET /v1/usage: GPU-hours by user, node or GPU class.
  void usage(const net::HttpRequest& request, const Caller& caller, Respond respond);
  // Runs `read` on the history reader's thread (or on the loop against the store, without
  // a reader) and answers with what it returns. `read` may use only what it captured by
  // value and the store it is given.
  void read_ended(std::function<net::HttpResponse(store::Store&)> read, Respond respond);
  // GET /v1/jobs/ID?wait=S: answers when the job ends (after that is durable) or S
  // seconds have passed, whichever is first; the caller then sees the state either way.
  void wait_job(model::JobId id, const net::HttpRequest& request, const Caller& caller, Respond respond);
  void answer_job_waits(model::JobId id);
  // whole_array: an array's id (its first element) cancels every live element.
  net::HttpResponse cancel_job(model::JobId id, const Caller& caller, bool whole_array);
  // POST /v1/jobs/cancel {"ids": [...]} or {"user": [...], "state": [...]}: each job
  // cancelled or refused on its own; one commit for all.
  net::HttpResponse cancel_jobs(const net::HttpRequest& request, const Caller& caller);
  // Cancels one live job in the ledger; the caller flushes the effects.
  Result<const Job*> cancel_one(model::JobId id, const Caller& caller);
  void job_logs(model::JobId id, const net::HttpRequest& request, const Caller& caller, Respond respond);
  // GET /v1/jobs/ID/stack[?rank=R]: every running rank's stack report, from its agent.
  void job_stack(model::JobId id, const net::HttpRequest& request, const Caller& caller, Respond respond);
  void answer_stack(StackWait wait);
  // 403 unless the caller owns the job or is an admin; 404 where jobs are private.
  std::optional<net::HttpResponse> refuse_other_users_job(const store::JobRecord& rec, const Caller& caller) const;
  // What the node's agent link says (connected, heard from, silent since, lost at), its
  // instants dated by the wall clock as it reads `now`.
  void link_view(const std::string& node, const Now& now, NodeView& v) const;
  // private_data: jobs, and the job is neither the caller's nor the caller an admin's
  // (a null caller: an anonymous status page, which sees no job).
  bool job_hidden_from(const std::string& owner, const Caller* caller) const;
  net::HttpResponse list_nodes(const net::HttpRequest& request, const Caller& caller);
  net::HttpResponse drain_node(const std::string& name, const net::HttpRequest& request, bool drain);
  // An admin says the node's unconfirmed ranks are dead (the node will not come back).
  net::HttpResponse clear_node(const std::string& name, const Caller& caller);
  // Per-user series only where no private_data item hides them, or for an admin.
  net::HttpResponse metrics(const Caller* caller);
  // Who reads /metrics or /v1/status: nobody (nullopt) on a public page without a
  // token; one given there is checked only where private_data makes it matter.
  Result<std::optional<Caller>> status_reader(const net::HttpRequest& request);

  // ---- the status page (status.cpp)
  // "/" and "/status.js": the page itself, public (it holds no data).
  net::HttpResponse status_page(std::string_view path);
  // GET /v1/status[?offset=N&limit=N]: the strip, the grid and a page of the queue; with
  // private jobs, only the caller's jobs are named (none for a null caller).
  net::HttpResponse status(const net::HttpRequest& request, const Caller* caller);
  // GET /v1/status/events: an event each time the status changed (coalesced), and a
  // comment line every kStatusPing so both ends see a dead link.
  // token_hash: the token that opened it on a private page ("" on a public one); the
  // stream is closed once that token is gone (checked every kTokenRecheck).
  net::HttpResponse status_events(std::string token_hash);
  void close_streams_of_gone_tokens();
  void drop_closed_streams();
  std::string status_event() const;
  // Something on the page may have changed: after each commit, and when a link closed.
  void status_changed();
  void broadcast_status(const std::string& text);
  static constexpr Duration kStatusEventGap = std::chrono::milliseconds(250);
  static constexpr Duration kStatusPing = std::chrono::seconds(15);

  net::EventLoop& loop_;
  const Clock& clock_;
  bool failed_ = false;
  store::Store& store_;
  std::shared_ptr<store::Store> history_reader_;
  std::unique_ptr<net::BlockingWork> history_work_;
  std::unordered_map<std::uint64_t, Respond> reads_waiting_;  // by read, while history_work_ reads
  std::uint64_t next_read_ = 0;
  model::CoordinatorConfig config_;
  ledger::Ledger ledger_;
  Committer committer_;
  SubmitKeys submit_keys_{store_};
  // Each node's current agent link; messages for a node without one are dropped (the
  // ledger judges what was lost once the agent is back and Synced).
  std::unordered_map<std::string, std::shared_ptr<net::WsConnection>> conns_;
  // Reports received on each node's current connection, acknowledged (Ack) once what
  // they changed is committed; `ack_due_` holds the nodes owed one.
  std::map<std::string, std::uint64_t> received_;
  std::vector<std::string> ack_due_;
  void acknowledge(const std::string& node);
  // Sends the Acks owed, unless rank records (Ledger::take_rank_records) still wait for
  // their write: then once it is committed.
  void send_acks();
  bool acks_held_ = false;
  // The ledger's rank records are written with a batch at most every twice the time the
  // last such batch took: a gang of 8,000 ranks whose reports come one at a time would
  // otherwise write its whole record once per report. The reports wait for their Ack.
  std::vector<store::Change> collect_rank_records();
  std::unique_ptr<net::Timer> rank_write_timer_;
  bool rank_write_armed_ = false;
  bool rank_write_in_batch_ = false;
  std::chrono::steady_clock::time_point rank_write_next_{};
  struct CachedUser {
    store::User user;
    Instant checked{};
  };
  // By token hash; an entry is checked against the database again after
  // kTokenRecheck, so a token replaced by `add-user` stops working without a restart.
  static constexpr Duration kTokenRecheck = std::chrono::seconds(5);
  std::unordered_map<std::string, CachedUser> users_;
  std::map<std::uint64_t, LogWait> log_waits_;
  std::map<std::uint64_t, StackWait> stack_waits_;
  std::multimap<model::JobId, JobWait> job_waits_;
  std::uint64_t next_log_request_ = 1;
  bool pass_posted_ = false;
  Instant last_periodic_pass_{};
  std::unique_ptr<net::Timer> tick_timer_;
  Instant last_trim_{};  // malloc_trim in tick()
  std::unique_ptr<net::Timer> pass_timer_;
  std::chrono::steady_clock::time_point last_pass_end_{};
  std::chrono::steady_clock::duration last_pass_took_{};
  CoordinatorStats stats_;
  // The status page's live feed: a change counter, jobs ended so far, the open streams.
  std::uint64_t status_seq_ = 0;
  std::uint64_t status_ended_ = 0;
  struct StatusStream {
    std::shared_ptr<net::EventStream> stream;
    std::string token_hash;
  };
  std::vector<StatusStream> status_streams_;
  Instant last_stream_token_check_{};
  std::unique_ptr<net::Timer> status_timer_;
  std::unique_ptr<NodeListing> node_listing_;  // GET /v1/nodes's renderings, kept
  bool status_post_armed_ = false;
  Instant last_status_ping_{};
  // The last /v1/status answer: every open page asks again after each change, and one
  // build serves them all while nothing changed (for at most kStatusReuse).
  struct StatusAnswer {
    std::uint64_t seq = 0;
    std::size_t offset = 0, limit = 0;
    std::string viewer;  // whose jobs it names: "*" every one's, else "u:" and a user, "-" none
    Instant built{};
    std::string body;
  };
  StatusAnswer status_answer_;
  static constexpr Duration kStatusReuse = std::chrono::seconds(1);
};

}  // namespace corral::service
