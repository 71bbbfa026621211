#include "tests/sim/ledger_sim.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <tuple>

#include "common/core/overloaded.hpp"
#include "common/model/job_spec_yaml.hpp"
#include "common/protocol/codec.hpp"
#include "coordinator/store/store_rules.hpp"

namespace corral::sim {

namespace {

using model::JobState;
using namespace std::chrono_literals;

}  // namespace

LedgerSim::LedgerSim(std::uint64_t seed, std::string db_path, bool clock_steps)
    : seed_(seed), rng_(seed), db_path_(std::move(db_path)), now_(TimePoint(std::chrono::hours(1000))),
      clock_steps_(clock_steps) {
  // The ledger's operator messages, thousands per run: CORRAL_SIM_LOG=1 shows them.
  spdlog::set_level(std::getenv("CORRAL_SIM_LOG") ? spdlog::level::info : spdlog::level::off);
  trace_ = std::getenv("CORRAL_SIM_TRACE") != nullptr;  // every message, with its step
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path_ + suffix, ec);
  config_.heartbeat_interval = 200ms;
  config_.node_timeout = 1500ms;
  // Stalls and outages run from a fraction of a second to several: some end within
  // node_timeout, some between it and node_lost_timeout (the node's jobs must run on),
  // some past it (a real loss). As long as the reconnect grace, so that an agent not back
  // when a restarted coordinator's grace ends was silent that long too.
  config_.node_lost_timeout = 3s;
  config_.reconnect_grace = 3s;
  config_.kill_grace = 1s;
  int n = pick(2, 4);
  for (int i = 0; i < n; ++i) {
    model::Node node;
    node.name = "n" + std::to_string(i);
    node.address = "10.9.0." + std::to_string(i < 2 && chance(0.3) ? 1 : i + 1);  // two agents may share a host
    node.ports = {29500, 29500 + pick(1, 3)};
    node.simulated = true;
    int gpus = pick(1, 4);
    for (int g = 0; g < gpus; ++g) {
      model::Gpu gpu;
      gpu.index = g;
      gpu.uuid = "GPU-" + node.name + "-" + std::to_string(g);
      gpu.cls = {"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"};
      gpu.cuda = {12, 4};
      node.gpus.push_back(gpu);
    }
    nodes_.push_back(node);
    Agent a;
    a.name = node.name;
    agents_.push_back(std::move(a));
  }
}

LedgerSim::~LedgerSim() {
  ledger_.reset();
  store_.reset();
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_path_ + suffix, ec);
}

std::string LedgerSim::fail(const std::string& what) const {
  return "seed " + std::to_string(seed_) + ", step " + std::to_string(step_) + ": " + what;
}

LedgerSim::Agent& LedgerSim::agent(const std::string& name) {
  for (auto& a : agents_) {
    if (a.name == name) return a;
  }
  return agents_.front();
}

// ---------------------------------------------------------------- the coordinator

void LedgerSim::coordinator_start() {
  auto opened = store::SqliteStore::open(db_path_);
  if (!opened) {
    broken_ = fail("cannot open the store: " + opened.error().message());
    return;
  }
  store_ = std::move(*opened);
  auto snapshot = store_->load();
  if (!snapshot) {
    broken_ = fail("cannot load: " + snapshot.error().message());
    return;
  }
  ledger_ = std::make_unique<ledger::Ledger>(config_);
  // A new process: its monotonic clock reads from anywhere (another boot, or the same).
  mono_origin_ = Duration(static_cast<std::int64_t>(pick(0, 1'000'000'000)));
  if (auto ok = ledger_->restore(std::move(*snapshot), coordinator_now()); !ok) {
    broken_ = fail("cannot restore: " + ok.error().message());
    return;
  }
  commit_effects();
}

void LedgerSim::coordinator_crash() {
  ++stats_.coordinator_crashes;
  if (trace_) std::fprintf(stderr, "%d coordinator crash\n", step_);
  ledger_.reset();  // whatever it had not committed is gone
  store_.reset();
  held_.clear();
  store_failing_until_.reset();
  for (auto& a : agents_) {
    if (a.connected) agent_drop_link(a);
  }
}

// The committer's work: every change of the turn in one transaction, then the sends.
void LedgerSim::commit_effects() {
  if (!ledger_) return;
  ledger::Effects e = ledger_->take();
  if (store_failing_until_) {
    // As the committer does: the batch is kept and tried again; nothing it holds is sent
    // and no report is acknowledged until it is durable. Closes are not held.
    for (const auto& [node, why] : e.close) {
      Agent& a = agent(node);
      if (a.connected) agent_drop_link(a);
    }
    e.close.clear();
    held_.push_back(std::move(e));
    return;
  }
  if (!e.changes.empty()) {
    auto results = store_->commit(e.changes);
    for (const auto& r : results) {
      if (!r) {
        std::string detail;
        if (auto all = store_->jobs({})) {
          for (const auto& j : *all) {
            if (!model::holds_resources(j.state) && !j.fenced()) continue;
            detail += "\n  job " + std::to_string(j.id) + " " + std::string(model::to_string(j.state)) + " attempt " +
                      std::to_string(j.attempt) + " fences " + std::to_string(j.fences.size());
            for (const auto& f : j.fences) detail += " [" + f.node + " a" + std::to_string(f.attempt) + "]";
            for (const auto& rk : j.ranks) detail += " " + rk.node + ":" + std::string(model::to_string(rk.state)) + (rk.gone ? "/gone" : "");
          }
        }
        broken_ = fail("the store refused a change: " + r.error().message() + detail);
        return;
      }
    }
  }
  for (auto& m : e.messages) {
    // The service sends on the link its Hello came on; before that, nowhere.
    Agent& a = agent(m.node);
    if (a.connected && a.hello_delivered) a.to_agent.push_back(std::move(m.message));
  }
  for (const auto& [node, why] : e.close) {
    Agent& a = agent(node);
    if (a.connected) agent_drop_link(a);
  }
  // Acknowledge each link's reports, now that what they changed is durable.
  for (auto& a : agents_) {
    if (a.connected && a.received > a.ack_sent) {
      a.to_agent.push_back(protocol::Ack{a.received});
      a.ack_sent = a.received;
    }
  }
}

void LedgerSim::deliver_to_coordinator(Agent& a) {
  if (!ledger_ || !a.connected || a.stalled_until || a.to_coordinator.empty()) return;
  protocol::AgentMessage m = std::move(a.to_coordinator.front());
  a.to_coordinator.pop_front();
  if (trace_) std::fprintf(stderr, "%d %s -> coordinator: %s\n", step_, a.name.c_str(), protocol::encode(m).substr(0, 160).c_str());
  if (auto* hello = std::get_if<protocol::Hello>(&m)) {
    a.hello_delivered = true;
    a.received = 0;
    a.ack_sent = 0;
    if (auto ok = ledger_->agent_hello(a.name, *hello, coordinator_now()); !ok) {
      broken_ = fail("hello refused: " + ok.error().message());
      return;
    }
  } else {
    ledger_->agent_message(a.name, m, coordinator_now());
    if (protocol::is_report(m)) ++a.received;
    if (std::holds_alternative<protocol::Synced>(m)) {
      a.synced = true;  // the coordinator knows all it knows: the outage is over
      a.outage = Duration{};
    }
  }
  // Sometimes the coordinator dies before this turn's commit.
  if (chance(0.01)) return coordinator_crash();
  commit_effects();
}

void LedgerSim::store_recovers() {
  if (trace_) std::fprintf(stderr, "%d store takes writes again (%zu batches held)\n", step_, held_.size());
  store_failing_until_.reset();
  std::vector<ledger::Effects> held = std::move(held_);
  held_.clear();
  std::vector<store::Change> changes;
  for (auto& e : held) {
    for (auto& c : e.changes) changes.push_back(std::move(c));
  }
  for (const auto& r : store_->commit(changes)) {
    if (!r) {
      broken_ = fail("the store refused a held change: " + r.error().message());
      return;
    }
  }
  for (auto& e : held) {
    for (auto& m : e.messages) {
      Agent& a = agent(m.node);
      if (a.connected && a.hello_delivered) a.to_agent.push_back(std::move(m.message));
    }
  }
  commit_effects();  // and the acknowledgements, now that it is all durable
}

// ---------------------------------------------------------------- agents

void LedgerSim::agent_send(Agent& a, protocol::AgentMessage m) {
  if (a.connected && a.welcomed) {
    if (protocol::is_report(m)) a.unacked.push_back(m);
    a.to_coordinator.push_back(std::move(m));
    return;
  }
  if (protocol::is_report(m)) a.outbox.push_back(std::move(m));
}

void LedgerSim::agent_connect(Agent& a) {
  if (!a.up || a.connected || a.stalled_until || !ledger_) return;
  a.connected = true;
  a.welcomed = false;
  const model::Node& node = *std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.name == a.name; });
  protocol::Hello h;
  h.node = node.name;
  h.address = node.address;
  h.ports = node.ports;
  h.simulated = true;
  h.driver = "550.54.15";
  h.cuda = {12, 4};
  h.gpus = node.gpus;
  for (const auto& [key, idx] : a.attempts) {
    for (std::size_t i : idx) {
      if (procs_[i].alive) h.running.push_back({key.first, key.second, procs_[i].rank, static_cast<int>(i) + 100});
    }
  }
  a.to_coordinator.push_back(std::move(h));
}

void LedgerSim::agent_drop_link(Agent& a) {
  if (trace_) std::fprintf(stderr, "%d %s link drops\n", step_, a.name.c_str());
  bool was = a.connected;
  a.connected = false;
  a.welcomed = false;
  a.synced = false;
  a.hello_delivered = false;
  a.to_coordinator.clear();  // written into a dead socket
  a.to_agent.clear();
  // Not acknowledged: maybe never read. Sent again, first, on the next connection.
  a.outbox.insert(a.outbox.begin(), a.unacked.begin(), a.unacked.end());
  a.unacked.clear();
  a.acked = 0;
  if (was && ledger_) {
    ledger_->agent_disconnected(a.name);
    commit_effects();
  }
}

void LedgerSim::agent_crash(Agent& a) {
  if (!a.up) return;
  ++stats_.agent_crashes;
  agent_drop_link(a);
  a.up = false;
  a.stalled_until.reset();
  a.outbox.clear();  // its memory is gone; its ranks live on, orphans
  a.finished.clear();
  for (const auto& [key, idx] : a.attempts) {
    for (std::size_t i : idx) procs_[i].sigkill_at.reset();
  }
  for (const auto& p : procs_) {
    if (p.node == a.name) excused_.insert({p.job, p.attempt});  // its reports died with it
  }
}

void LedgerSim::agent_restart(Agent& a) {
  if (a.up) return;
  a.up = true;
  ++a.generation;
  // The spool's markers: kill what the last agent process left, report each as ended.
  for (const auto& [key, idx] : a.attempts) {
    for (std::size_t i : idx) {
      Proc& p = procs_[i];
      if (!p.alive) continue;
      p.alive = false;
      p.signal = 9;
      agent_send(a, protocol::RankExited{p.job, p.attempt, p.rank, 0, 9, "killed by signal 9: left by an earlier agent", false});
    }
  }
  a.attempts.clear();
}

void LedgerSim::maybe_gone(Agent& a, const Key& key) {
  auto it = a.attempts.find(key);
  if (it == a.attempts.end()) return;
  for (std::size_t i : it->second) {
    if (procs_[i].alive) return;
  }
  a.attempts.erase(it);
  a.finished.insert(key);
  agent_send(a, protocol::AttemptGone{key.first, key.second});
}

void LedgerSim::rank_ended(Agent& a, std::size_t i) {
  Proc& p = procs_[i];
  a.spool[{p.job, p.attempt, p.rank}] = std::make_pair(p.exit_code, p.signal);
  protocol::RankExited m{p.job, p.attempt, p.rank, p.exit_code, p.signal, "", false};
  m.reason = p.signal ? "killed by signal " + std::to_string(p.signal) : "exited with code " + std::to_string(p.exit_code);
  agent_send(a, m);
  maybe_gone(a, {p.job, p.attempt});
}

void LedgerSim::agent_kill(Agent& a, const Key& key, bool grace) {
  auto it = a.attempts.find(key);
  if (it == a.attempts.end()) {
    agent_send(a, protocol::AttemptGone{key.first, key.second});  // nothing of it here
    return;
  }
  std::vector<std::size_t> idx = it->second;
  for (std::size_t i : idx) {
    Proc& p = procs_[i];
    if (!p.alive) continue;
    if (grace && p.ignores_term) {
      if (!p.sigkill_at) p.sigkill_at = now_ + config_.kill_grace;
      continue;
    }
    p.alive = false;
    p.signal = grace ? 15 : 9;
    rank_ended(a, i);
  }
}

void LedgerSim::deliver_to_agent(Agent& a) {
  if (!a.up || !a.connected || a.stalled_until || a.to_agent.empty()) return;
  protocol::CoordinatorMessage m = std::move(a.to_agent.front());
  a.to_agent.pop_front();
  if (trace_) std::fprintf(stderr, "%d coordinator -> %s: %s\n", step_, a.name.c_str(), protocol::encode(m).substr(0, 160).c_str());
  std::visit(Overloaded{
                 [&](const protocol::Welcome&) {
                   a.welcomed = true;
                   while (!a.outbox.empty()) {
                     a.unacked.push_back(a.outbox.front());
                     a.to_coordinator.push_back(std::move(a.outbox.front()));
                     a.outbox.pop_front();
                   }
                   a.to_coordinator.push_back(protocol::Synced{});
                 },
                 [&](const protocol::Reconcile& r) {
                   std::vector<Key> orphaned;
                   for (const auto& [key, idx] : a.attempts) {
                     if (std::find(r.keep.begin(), r.keep.end(), key) == r.keep.end()) orphaned.push_back(key);
                   }
                   for (const auto& key : orphaned) agent_kill(a, key, false);
                 },
                 [&](const protocol::Prepare& p) {
                   bool busy = faults_ && chance(0.05);  // a foreign process holds the port
                   agent_send(a, protocol::PrepareResult{p.job, p.attempt, !busy, busy, "", busy ? "in use" : "", p.master_port});
                 },
                 [&](const protocol::Launch& l) {
                   Key key{l.job, l.attempt};
                   if (a.finished.contains(key) || a.attempts.contains(key)) return;
                   auto& idx = a.attempts[key];
                   for (const auto& r : l.ranks) {
                     auto spooled = a.spool.find({l.job, l.attempt, r.rank});
                     if (spooled != a.spool.end()) {
                       // Started here before (an earlier agent process): never twice.
                       protocol::RankExited ended{l.job, l.attempt, r.rank, -1, 0, "end unknown", false};
                       if (spooled->second) std::tie(ended.exit_code, ended.signal) = *spooled->second;
                       agent_send(a, ended);
                       continue;
                     }
                     a.spool[{l.job, l.attempt, r.rank}] = std::nullopt;
                     ++starts_[{l.job, l.attempt, r.rank}];
                     Proc p;
                     p.node = a.name;
                     p.job = l.job;
                     p.attempt = l.attempt;
                     p.rank = r.rank;
                     p.gpus = r.gpus;
                     p.host = l.master_addr;
                     p.port = l.master_port;
                     p.ignores_term = chance(0.2);
                     p.owner = a.generation;
                     procs_.push_back(p);
                     idx.push_back(procs_.size() - 1);
                     agent_send(a, protocol::RankStarted{l.job, l.attempt, r.rank, static_cast<int>(procs_.size()) + 99});
                     // Most ranks check in to the rendezvous; some never do (hung before it).
                     if (chance(0.8)) agent_send(a, protocol::RankJoined{l.job, l.attempt, r.rank});
                   }
                   maybe_gone(a, key);  // none started: nothing of it runs here
                 },
                 [&](const protocol::Kill& k) { agent_kill(a, {k.job, k.attempt}, k.grace_ms > 0); },
                 [&](const protocol::LogRequest&) {},
                 [&](const protocol::StackRequest&) {},  // answered to an HTTP caller, not the ledger
                 [&](const protocol::Inspect& in) {
                   protocol::Inspection answer{in.job, in.attempt, {}};
                   for (int rank : in.ranks) {
                     protocol::RankProcess p;
                     p.rank = rank;
                     for (const auto& proc : procs_) {
                       if (proc.node == a.name && proc.job == in.job && proc.attempt == in.attempt && proc.rank == rank)
                         p.alive = proc.alive;
                     }
                     answer.ranks.push_back(p);
                   }
                   agent_send(a, answer);
                 },
                 [&](const protocol::Ack& k) {
                   while (a.acked < k.received && !a.unacked.empty()) {
                     a.unacked.pop_front();
                     ++a.acked;
                   }
                 },
             },
             m);
}

void LedgerSim::advance(Duration d) {
  now_ += d;
  for (auto& a : agents_) {
    if (a.stalled_until && now_ >= *a.stalled_until) {
      a.stalled_until.reset();
      if (a.synced) a.outage = Duration{};  // its link outlived the stall: nothing was missed
    }
    if (ledger_ && (!a.synced || a.stalled_until)) {
      a.outage += d;
      // Silent for node_lost_timeout while the coordinator ran: a real loss.
      // (Shorter, between node_timeout and it, the node's jobs must run on.)
      if (a.outage >= config_.node_lost_timeout) {
        // Every attempt with a rank here: its end may still be held back by the agent.
        for (const auto& p : procs_) {
          if (p.node == a.name) excused_.insert({p.job, p.attempt});
        }
      }
    }
    if (!a.up || a.stalled_until) continue;
    // SIGKILL after the grace for ranks that ignored SIGTERM.
    for (auto& [key, idx] : a.attempts) {
      (void)key;
      for (std::size_t i : std::vector<std::size_t>(idx)) {
        Proc& p = procs_[i];
        if (p.alive && p.sigkill_at && now_ >= *p.sigkill_at) {
          p.alive = false;
          p.signal = 9;
        }
      }
    }
    std::vector<Key> keys;
    for (const auto& [key, idx] : a.attempts) keys.push_back(key);
    for (const auto& key : keys) {
      auto it = a.attempts.find(key);
      if (it == a.attempts.end()) continue;
      for (std::size_t i : std::vector<std::size_t>(it->second)) {
        if (!procs_[i].alive && procs_[i].signal == 9 && procs_[i].sigkill_at) {
          procs_[i].sigkill_at.reset();
          rank_ended(a, i);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- the world

void LedgerSim::step(bool faults) {
  ++step_;
  ++stats_.steps;
  advance(std::chrono::milliseconds(pick(10, faults ? 700 : 300)));
  if (!ledger_) {
    if (!faults || chance(0.3)) coordinator_start();
    return;
  }
  // Heartbeats arrive on time from every agent that is up and welcomed (their order
  // among the other messages changes nothing).
  for (auto& a : agents_) {
    if (a.up && a.connected && a.welcomed && !a.stalled_until)
      ledger_->agent_message(a.name, protocol::Heartbeat{}, coordinator_now());
  }
  if (store_failing_until_ && now_ >= *store_failing_until_) store_recovers();
  if (broken_ || !ledger_) return;
  int op = pick(0, 99);
  if (faults && op < 12) {
    std::string spec = "name: sim\ncommand: \"true\"\nretries: " + std::to_string(pick(0, 2)) +
                       "\nresources: {nodes: " + std::to_string(pick(1, 2)) +
                       ", gpus_per_node: " + std::to_string(pick(1, 2)) + "}\n";
    auto parsed = model::parse_job_spec(spec, "sim.yaml");
    // Jobs wait for nodes that never joined; in this cluster every node joins first.
    if (ledger_->scheduler().nodes().size() < nodes_.size()) return;
    if (!parsed || !ledger_->scheduler().admissible(*parsed)) return;
    if (store_failing_until_) return;  // 503: nothing taken, nothing acknowledged
    auto submitted = ledger_->submit("alice", *parsed, spec, coordinator_now());
    if (!submitted) return;
    if (chance(0.02)) return coordinator_crash();  // before the commit: never acknowledged
    auto ok = store_->commit(submitted->change);
    if (!ok) {
      broken_ = fail("submit not stored: " + ok.error().message());
      return;
    }
    acknowledged_.insert(submitted->id);
    ++stats_.jobs;
    commit_effects();
  } else if (op < 22) {
    if (store_failing_until_) return;  // passes wait until the store takes writes
    ledger_->schedule(coordinator_now());
    commit_effects();
  } else if (op < 32) {
    ledger_->tick(coordinator_now());
    commit_effects();
  } else if (op < 52) {
    Agent& a = agents_[static_cast<std::size_t>(pick(0, static_cast<int>(agents_.size()) - 1))];
    for (int n = pick(1, 4); n > 0 && ledger_; --n) deliver_to_coordinator(a);
  } else if (op < 72) {
    Agent& a = agents_[static_cast<std::size_t>(pick(0, static_cast<int>(agents_.size()) - 1))];
    for (int n = pick(1, 4); n > 0; --n) deliver_to_agent(a);
  } else if (op < 84) {
    // A rank ends by itself: mostly exit 0.
    std::vector<std::size_t> alive;
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      const Agent& on = agent(procs_[i].node);
      if (procs_[i].alive && on.up && !on.stalled_until && !procs_[i].sigkill_at) alive.push_back(i);
    }
    if (alive.empty()) return;
    std::size_t i = alive[static_cast<std::size_t>(pick(0, static_cast<int>(alive.size()) - 1))];
    Proc& p = procs_[i];
    p.alive = false;
    p.natural = true;
    p.exit_code = faults && chance(0.1) ? 1 : 0;
    rank_ended(agent(p.node), i);
  } else if (op < 90) {
    for (auto& a : agents_) {
      if (!a.connected) agent_connect(a);
    }
  } else if (!faults) {
    for (auto& a : agents_) agent_restart(a);
  } else if (op < 93) {
    coordinator_crash();
  } else if (op < 95) {
    agent_crash(agents_[static_cast<std::size_t>(pick(0, static_cast<int>(agents_.size()) - 1))]);
  } else if (op < 97) {
    agent_restart(agents_[static_cast<std::size_t>(pick(0, static_cast<int>(agents_.size()) - 1))]);
  } else {
    Agent& a = agents_[static_cast<std::size_t>(pick(0, static_cast<int>(agents_.size()) - 1))];
    const int what = pick(0, 5);
    if (what == 4) {
      // The coordinator host's wall clock steps (boot, VM resume, NTP's first sync): no
      // deadline may move with it.
      static constexpr Duration kSteps[] = {10s, -10s, 1h, -1h};
      const Duration by = kSteps[pick(0, 3)];
      if (clock_steps_) wall_offset_ += by;
      ++stats_.clock_steps;
      if (trace_) std::fprintf(stderr, "%d wall clock steps to %+lld ms\n", step_, static_cast<long long>(wall_offset_.count()));
    } else if (what == 5) {
      // The disk fills (or turns read-only) for up to 6 s.
      if (!store_failing_until_) {
        store_failing_until_ = now_ + Duration(pick(100, 6000));
        ++stats_.store_outages;
        if (trace_) std::fprintf(stderr, "%d store refuses writes\n", step_);
      }
    } else if (what < 2) {
      if (a.connected) agent_drop_link(a);
    } else if (a.up && !a.stalled_until) {
      // Stopped for 0.3 s to 8 s (node_timeout is 1.5 s, node_lost_timeout 3 s), its link left open.
      a.stalled_until = now_ + Duration(pick(300, 8000));
      if (trace_)
        std::fprintf(stderr, "%d %s stalls until +%lld ms\n", step_, a.name.c_str(),
                     static_cast<long long>((*a.stalled_until - now_).count()));
    }
  }
}

std::optional<std::string> LedgerSim::check_holds() {
  auto all = store_->jobs({});
  if (!all) return fail("cannot read jobs: " + all.error().message());
  std::map<std::pair<std::string, int>, model::JobId> held;
  for (const auto& j : *all) {
    for (const auto& g : store::gpus_held_by(j)) held[{g.node, g.index}] = j.id;
  }
  for (const auto& node : nodes_) {
    if (ledger_->scheduler().node(node.name) == nullptr) continue;
    for (const auto& g : node.gpus) {
      auto in_memory = ledger_->scheduler().gpu_holder(node.name, g.index);
      auto it = held.find({node.name, g.index});
      std::optional<model::JobId> on_disk;
      if (it != held.end()) on_disk = it->second;
      if (in_memory != on_disk) {
        return fail("GPU " + std::to_string(g.index) + " of " + node.name + ": held by " +
                    (in_memory ? "job " + std::to_string(*in_memory) : std::string("nobody")) + " in memory, by " +
                    (on_disk ? "job " + std::to_string(*on_disk) : std::string("nobody")) + " on disk");
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> LedgerSim::check() {
  if (broken_) return broken_;
  for (const auto& [key, n] : starts_) {
    if (n > 1) {
      return fail("job " + std::to_string(std::get<0>(key)) + " attempt " + std::to_string(std::get<1>(key)) +
                  " rank " + std::to_string(std::get<2>(key)) + " started " + std::to_string(n) + " times");
    }
  }
  if (!ledger_) return std::nullopt;
  // Memory and disk agree on who holds every GPU (read back every few steps: decoding
  // every job is most of a step's cost), but while the store refuses writes: then memory
  // is ahead of the disk, and nothing it decided is sent until the disk has it.
  if (step_ % 16 == 0 && held_.empty()) {
    if (auto bad = check_holds()) return bad;
  }
  // A GPU serves one job until that job's processes on it are dead.
  for (const auto& p : procs_) {
    if (!p.alive) continue;
    // And its master port: while any rank of the attempt lives, no other job gets it.
    auto port_holder = ledger_->scheduler().port_holder(p.host, p.port);
    if (port_holder != p.job) {
      return fail("port " + std::to_string(p.port) + " on " + p.host + " is " +
                  (port_holder ? "held by job " + std::to_string(*port_holder) : std::string("free")) + " while job " +
                  std::to_string(p.job) + " attempt " + std::to_string(p.attempt) + " rank " + std::to_string(p.rank) +
                  " still runs");
    }
    for (int g : p.gpus) {
      auto holder = ledger_->scheduler().gpu_holder(p.node, g);
      if (holder != p.job) {
        return fail("GPU " + std::to_string(g) + " of " + p.node + " is " +
                    (holder ? "held by job " + std::to_string(*holder) : std::string("free")) + " while job " +
                    std::to_string(p.job) + " attempt " + std::to_string(p.attempt) + " rank " +
                    std::to_string(p.rank) + " still runs there");
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> LedgerSim::run(int fault_steps) {
  coordinator_start();
  for (auto& a : agents_) agent_connect(a);
  for (int i = 0; i < fault_steps; ++i) {
    step(true);
    if (auto bad = check()) return bad;
  }
  // Faults stop: every job must reach a terminal state, every fence go.
  faults_ = false;
  for (int i = 0; i < 12000; ++i) {
    step(false);
    if (auto bad = check()) return bad;
    if (i % 50 != 49 || !ledger_) continue;
    bool busy = !ledger_->live_jobs().empty() || !ledger_->scheduler().fences().empty();
    for (const auto& p : procs_) busy = busy || p.alive;
    if (!busy) break;
  }
  if (!ledger_) coordinator_start();
  if (broken_) return broken_;
  auto jobs = store_->jobs({});
  if (!jobs) return fail("cannot read jobs: " + jobs.error().message());
  std::set<model::JobId> stored;
  for (const auto& rec : *jobs) {
    stored.insert(rec.id);
    if (!model::is_terminal(rec.state)) {
      std::string ranks;
      for (const auto& r : rec.ranks) ranks += " " + std::to_string(r.rank) + "@" + r.node + ":" + std::string(model::to_string(r.state)) + (r.gone ? "/gone" : "");
      std::string links;
      for (const auto& a : agents_) {
        links += " " + a.name + (a.up ? "" : " down") + (a.connected ? " conn" : "") + (a.welcomed ? " welcomed" : "") +
                 " out=" + std::to_string(a.outbox.size()) + " inflight=" + std::to_string(a.to_coordinator.size()) + "/" +
                 std::to_string(a.to_agent.size());
      }
      if (const auto* sj = ledger_->scheduler().job(rec.id); sj && rec.state == JobState::Pending) {
        links += "; pending: " + sj->reason.detail + "; ports held:";
        for (const auto& n : nodes_) {
          for (int port = n.ports.first; port <= n.ports.last; ++port) {
            if (auto h = ledger_->scheduler().port_holder(n.address, port)) {
              links += " " + n.address + ":" + std::to_string(port) + "=job " + std::to_string(*h);
            }
          }
        }
      }
      return fail("job " + std::to_string(rec.id) + " is still " + std::string(model::to_string(rec.state)) +
                  " after the faults stopped; attempt " + std::to_string(rec.attempt) + " ranks" + ranks + "; agents" + links);
    }
    if (rec.fenced()) return fail("job " + std::to_string(rec.id) + " still holds a fence");
    if (rec.state == JobState::Completed) ++stats_.completed;
    // Every rank of its last attempt exited 0 by itself: COMPLETED, unless a real loss
    // (a node silent longer than node_lost_timeout, an agent crash) ended it first.
    std::vector<const Proc*> last;
    for (const auto& p : procs_) {
      if (p.job == rec.id && p.attempt == rec.attempt) last.push_back(&p);
    }
    bool all_ok = !last.empty() && last.size() == rec.ranks.size() &&
                  std::all_of(last.begin(), last.end(), [](const Proc* p) { return p->natural && p->exit_code == 0; });
    if (all_ok && rec.state != JobState::Completed && !excused_.contains({rec.id, rec.attempt})) {
      return fail("job " + std::to_string(rec.id) + " ended " + std::string(model::to_string(rec.state)) +
                  " though every rank of attempt " + std::to_string(rec.attempt) + " exited 0");
    }
    if (rec.state == JobState::Completed && !all_ok) {
      return fail("job " + std::to_string(rec.id) + " is COMPLETED though not every rank exited 0");
    }
  }
  for (model::JobId id : acknowledged_) {
    if (!stored.contains(id)) return fail("acknowledged job " + std::to_string(id) + " was lost");
  }
  for (const auto& p : procs_) {
    if (p.alive) return fail("a rank of job " + std::to_string(p.job) + " still runs on " + p.node);
  }
  return std::nullopt;
}

std::string LedgerSim::outcome() {
  if (!ledger_) coordinator_start();
  std::string out;
  auto jobs = store_->jobs({});
  if (!jobs) return "cannot read jobs: " + jobs.error().message();
  std::map<model::JobId, int> started;
  for (const auto& [key, n] : starts_) started[std::get<0>(key)] += n;
  for (const auto& rec : *jobs) {
    out += std::to_string(rec.id) + " " + std::string(model::to_string(rec.state)) + " attempt " +
           std::to_string(rec.attempt) + " " + rec.reason + " " + rec.detail + ", ranks started " +
           std::to_string(started[rec.id]) + "\n";
  }
  return out;
}

}  // namespace corral::sim
