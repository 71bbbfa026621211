#pragma once
// A deterministic simulation of a corral cluster around the real Ledger, Scheduler and
// SqliteStore: simulated agents that behave as corral-agent does (held-back reports,
// acknowledgements, Synced, sweeps answered by AttemptGone, orphans killed by a restarted
// agent), simulated rank processes (some ignore SIGTERM), a fake clock, and a seeded
// fault injector: coordinator crashes at any step (also between a decision and its
// commit) and restarts that reopen the database, agent crashes and restarts, dropped
// links, stalled agents (silent for less or more than node_lost_timeout), delayed and
// interleaved messages, the coordinator's wall clock stepped (±10 s, ±1 h) and its store
// refusing writes for a while (a full disk: changes held, reports not acknowledged). After every step it checks the scheduler's
// promises against the simulated truth; a failure names its seed and step, and
// `run(seed)` replays it exactly.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "coordinator/ledger/ledger.hpp"
#include "coordinator/store/sqlite_store.hpp"

namespace corral::sim {

struct SimStats {
  int steps = 0;
  int jobs = 0;
  int completed = 0;
  int coordinator_crashes = 0;
  int agent_crashes = 0;
  int clock_steps = 0;
  int store_outages = 0;
};

class LedgerSim {
 public:
  // `db_path`: a SQLite file this run may create and delete. Without `clock_steps` the
  // wall clock is never stepped (the run is otherwise the same, fault for fault).
  LedgerSim(std::uint64_t seed, std::string db_path, bool clock_steps = true);
  ~LedgerSim();

  // Runs `fault_steps` steps with faults, then quiet steps until every job has ended (or
  // gives up). The first broken promise, with the seed and step, or nullopt.
  std::optional<std::string> run(int fault_steps = 250);
  const SimStats& stats() const { return stats_; }
  // After run(): how each job ended (state, attempt, reason) and how many ranks started,
  // one line per job. A wall-clock step must change none of it.
  std::string outcome();

 private:
  using Key = std::pair<model::JobId, int>;
  // One rank process, as the node's kernel sees it.
  struct Proc {
    std::string node;
    model::JobId job = 0;
    int attempt = 0;
    int rank = 0;
    std::vector<int> gpus;
    std::string host;  // the attempt's master port, from its Launch
    int port = 0;
    bool alive = true;
    bool ignores_term = false;
    std::optional<TimePoint> sigkill_at;  // SIGTERM ignored: the agent's SIGKILL comes then
    int owner = 0;                        // the agent process that started it (its generation)
    int exit_code = 0;
    int signal = 0;
    bool natural = false;                 // ended by itself
  };
  struct Agent {
    std::string name;
    bool up = true;        // the agent process runs
    int generation = 1;    // counts agent processes
    bool connected = false;
    bool welcomed = false;
    bool synced = false;   // its Synced reached the coordinator on this link
    bool hello_delivered = false;
    std::deque<protocol::AgentMessage> to_coordinator;  // in flight on the link
    std::deque<protocol::CoordinatorMessage> to_agent;
    std::deque<protocol::AgentMessage> outbox;          // held back
    std::deque<protocol::AgentMessage> unacked;
    std::uint64_t acked = 0;
    std::map<Key, std::vector<std::size_t>> attempts;   // attempt -> its procs here
    std::set<Key> finished;
    // The spool, which outlives agent processes: every rank started here, and how it
    // ended once that is known (rank logs and their .exit files).
    std::map<std::tuple<model::JobId, int, int>, std::optional<std::pair<int, int>>> spool;
    Duration outage{};  // link down (or agent stalled) while the coordinator is up
    // Stopped (SIGSTOP, a hung kernel) until then: it hears nothing, says nothing, and
    // notices nothing of its ranks; they run on.
    std::optional<TimePoint> stalled_until;
    std::uint64_t received = 0;                         // coordinator side: reports on this link
    std::uint64_t ack_sent = 0;
  };

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::string fail(const std::string& what) const;

  void step(bool faults);
  // Coordinator side.
  void coordinator_crash();
  void coordinator_start();
  void commit_effects();
  // The store takes writes again: what was held is committed in order, then sent.
  void store_recovers();
  // The coordinator's clocks: its host's wall clock (stepped by faults) and monotonic
  // clock (from an origin of its own in each coordinator process).
  Now coordinator_now() const { return {now_ + wall_offset_, Instant((now_ + mono_origin_).time_since_epoch())}; }
  void deliver_to_coordinator(Agent& a);
  // Agent side.
  void agent_connect(Agent& a);
  void agent_drop_link(Agent& a);
  void agent_crash(Agent& a);
  void agent_restart(Agent& a);
  void agent_send(Agent& a, protocol::AgentMessage m);
  void deliver_to_agent(Agent& a);
  void agent_kill(Agent& a, const Key& key, bool grace);
  void rank_ended(Agent& a, std::size_t proc);
  void maybe_gone(Agent& a, const Key& key);
  void advance(Duration d);
  Agent& agent(const std::string& name);

  std::optional<std::string> check();
  std::optional<std::string> check_holds();

  std::uint64_t seed_;
  std::mt19937_64 rng_;
  std::string db_path_;
  model::CoordinatorConfig config_;
  std::unique_ptr<store::SqliteStore> store_;
  std::unique_ptr<ledger::Ledger> ledger_;
  TimePoint now_;  // the true time, by which agents and ranks live
  bool clock_steps_ = true;
  Duration wall_offset_{};
  Duration mono_origin_{};
  // While the store refuses writes (until then): the changes and sends held, in order.
  std::optional<TimePoint> store_failing_until_;
  std::vector<ledger::Effects> held_;
  std::vector<model::Node> nodes_;
  std::vector<Agent> agents_;
  std::vector<Proc> procs_;
  std::map<std::tuple<model::JobId, int, int>, int> starts_;  // (job, attempt, rank) -> times started
  std::set<model::JobId> acknowledged_;
  std::set<Key> excused_;  // attempts a real loss may end (their node was away long enough)
  std::optional<std::string> broken_;
  int step_ = 0;
  bool trace_ = false;
  bool faults_ = true;
  SimStats stats_;
};

}  // namespace corral::sim
