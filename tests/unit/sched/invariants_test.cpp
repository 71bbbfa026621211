// Randomised invariant tests: thousands of seeded event sequences against the core,
// checked after every step against a model kept from the decisions alone.

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "common/core/strings.hpp"
#include "coordinator/sched/scheduler.hpp"
#include "tests/unit/sched/builders.hpp"

namespace corral::sched {
namespace {

using namespace std::chrono_literals;
using model::JobState;

struct Held {
  std::map<std::pair<std::string, int>, model::JobId> gpus;
  std::map<std::pair<std::string, int>, model::JobId> ports;
  std::map<model::JobId, JobState> states;
  std::map<model::JobId, model::JobSpec> specs;
};

class Fuzz {
 public:
  explicit Fuzz(std::uint64_t seed) : rng_(seed) {}

  void run(int steps) {
    make_cluster();
    for (int i = 0; i < steps; ++i) {
      step();
      check();
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Drain: finish everything and the cluster must be entirely free again.
    for (int i = 0; i < 200 && !live().empty(); ++i) {
      for (model::JobId id : live()) {
        finish(id);
      }
      for (const auto& n : nodes_) {
        if (s_.node(n.name)->state != model::NodeState::Up) apply(s_.set_node_state(n.name, model::NodeState::Up, "", now_));
        ASSERT_TRUE(s_.set_reachable(n.name, true).has_value());
      }
      apply(s_.schedule(now_));
      check();
    }
    EXPECT_TRUE(live().empty());
    EXPECT_TRUE(held_.gpus.empty());
    EXPECT_TRUE(held_.ports.empty());
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  void make_cluster() {
    // Classes that differ in product, in memory, and in driver version only.
    const model::GpuClass classes[] = {{"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"},
                                       {"NVIDIA A100-SXM4-40GB", 40960, "550.54.15"},
                                       {"NVIDIA A100-SXM4-80GB", 81920, "535.104.05"},
                                       {"NVIDIA H100 80GB HBM3", 81920, "550.54.15"}};
    int n = pick(2, 7);
    for (int i = 0; i < n; ++i) {
      const auto& c = classes[pick(0, 3)];
      auto b = testing::node("n" + std::to_string(i)).gpus(pick(1, 8), c.product, c.memory_mib, c.driver);
      if (chance(0.3)) b.gpus(pick(1, 4), classes[pick(0, 3)].product, 81920, "550.54.15");  // a mixed node
      if (chance(0.5)) b.address("10.7.0.1");  // several agents on one machine share ports
      b.ports(29500, 29500 + pick(1, 6));
      nodes_.push_back(b.build());
      apply(s_.update_node(nodes_.back(), now_));
    }
  }

  std::vector<model::JobId> live() const {
    std::vector<model::JobId> out;
    for (const auto& [id, st] : held_.states) {
      if (!model::is_terminal(st)) out.push_back(id);
    }
    return out;
  }

  void finish(model::JobId id) {
    const SchedJob* j = s_.job(id);
    if (!j) return;
    if (j->state == JobState::Pending) {
      apply(s_.on_event(id, j->attempt, JobEvent::Cancel, now_));
    } else if (j->state == JobState::Ending) {
      apply(s_.on_event(id, j->attempt, JobEvent::RanksGone, now_));
    } else {
      apply(s_.on_event(id, j->attempt, JobEvent::AllRanksExitedOk, now_));
    }
  }

  void step() {
    now_ += std::chrono::seconds(pick(1, 600));
    int op = pick(0, 99);
    if (op < 30) {
      auto spec = testing::job();
      if (chance(0.5)) {
        spec.nodes(pick(1, 3), pick(1, 4));
      } else {
        spec.total(pick(1, 10));
      }
      if (chance(0.2)) spec.model(chance(0.5) ? "NVIDIA A100*" : "NVIDIA H100*");
      if (chance(0.1)) spec.min_memory_mib(50000);
      if (chance(0.6)) spec.limit(std::chrono::minutes(pick(1, 120)));
      spec.priority(pick(-2, 2)).retries(pick(0, 2));
      model::JobSpec js = spec;
      if (!s_.admissible(js)) return;
      model::JobId id = next_id_++;
      ASSERT_TRUE(s_.add_pending(id, "user" + std::to_string(pick(0, 3)), js, now_).has_value());
      held_.states[id] = JobState::Pending;
      held_.specs[id] = js;
    } else if (op < 55) {
      apply(s_.schedule(now_));
    } else if (op < 85) {
      auto ids = live();
      if (ids.empty()) return;
      model::JobId id = ids[static_cast<std::size_t>(pick(0, static_cast<int>(ids.size()) - 1))];
      const SchedJob* j = s_.job(id);
      ASSERT_NE(j, nullptr);
      if (j->state == JobState::Ending && chance(0.5)) {
        // One node confirms its ranks gone: its GPUs free up (the port stays until the end).
        const auto& nodes = j->allocation->nodes;
        const std::string name = nodes[static_cast<std::size_t>(pick(0, static_cast<int>(nodes.size()) - 1))].node;
        model::Allocation alloc = *j->allocation;
        ASSERT_TRUE(s_.release_node(id, name, now_).has_value());
        if (released_[id].insert(name).second) {
          for (const auto& na : alloc.nodes) {
            if (na.node != name) continue;
            for (int g : na.gpus) ASSERT_EQ(held_.gpus.erase({na.node, g}), 1u);
          }
        }
        return;
      }
      JobEvent e = kAllJobEvents[pick(1, static_cast<int>(std::size(kAllJobEvents)) - 1)];  // anything but Schedule
      EventInfo info{pick(0, 3), "", pick(1, 2), ""};
      auto r = s_.on_event(id, j->attempt, e, now_, info);
      if (r) apply(*r);
    } else if (op < 90) {
      const auto& n = nodes_[static_cast<std::size_t>(pick(0, static_cast<int>(nodes_.size()) - 1))];
      auto st = static_cast<model::NodeState>(pick(0, 2));
      apply(s_.set_node_state(n.name, st, "fuzz", now_));
    } else if (op < 95) {
      // An agent's link drops or comes back: its jobs stay, no new job goes there.
      const auto& n = nodes_[static_cast<std::size_t>(pick(0, static_cast<int>(nodes_.size()) - 1))];
      ASSERT_TRUE(s_.set_reachable(n.name, chance(0.5)).has_value());
    } else {
      // The same node reports its inventory again: holdings survive.
      const auto& n = nodes_[static_cast<std::size_t>(pick(0, static_cast<int>(nodes_.size()) - 1))];
      model::Node again = n;
      again.state = s_.node(n.name)->state;
      apply(s_.update_node(again, now_));
    }
  }

  void apply(const Result<std::vector<Decision>>& r) {
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    apply(*r);
  }

  void apply(const std::vector<Decision>& ds) {
    for (const auto& d : ds) {
      const auto* c = std::get_if<JobChange>(&d);
      if (!c) continue;
      ASSERT_EQ(held_.states.at(c->job), c->from) << c->text;
      held_.states[c->job] = c->to;
      if (c->to == JobState::Starting) {
        ASSERT_TRUE(c->allocation.has_value());
        check_allocation(c->job, *c->allocation);
        for (const auto& na : c->allocation->nodes) {
          for (int g : na.gpus) {
            auto [it, fresh] = held_.gpus.emplace(std::make_pair(na.node, g), c->job);
            ASSERT_TRUE(fresh) << "GPU " << na.node << ":" << g << " held twice";
          }
        }
        auto [it, fresh] = held_.ports.emplace(std::make_pair(c->allocation->master_addr, c->allocation->master_port), c->job);
        ASSERT_TRUE(fresh) << "port held twice";
      } else if (model::holds_resources(c->from) && !model::holds_resources(c->to)) {
        // Only RanksGone (or PortBusy, before any launch) frees a job's resources.
        ASSERT_TRUE(c->event == JobEvent::RanksGone || c->event == JobEvent::PortBusy) << c->text;
        ASSERT_TRUE(c->allocation.has_value());
        const auto& released = released_[c->job];
        for (const auto& na : c->allocation->nodes) {
          if (released.contains(na.node)) continue;
          for (int g : na.gpus) ASSERT_EQ(held_.gpus.erase({na.node, g}), 1u);
        }
        ASSERT_EQ(held_.ports.erase({c->allocation->master_addr, c->allocation->master_port}), 1u);
        released_.erase(c->job);
      } else if (c->to == JobState::Ending) {
        ASSERT_TRUE(c->outcome.has_value()) << c->text;
      }
    }
  }

  const model::Node& node_named(const std::string& name) const {
    for (const auto& n : nodes_) {
      if (n.name == name) return n;
    }
    ADD_FAILURE() << "unknown node " << name;
    return nodes_.front();
  }

  void check_allocation(model::JobId id, const model::Allocation& a) {
    const auto& spec = held_.specs.at(id);
    auto shapes = model::candidate_shapes(spec);
    ASSERT_FALSE(a.nodes.empty());
    std::pair<int, int> shape{static_cast<int>(a.nodes.size()), static_cast<int>(a.nodes[0].gpus.size())};
    ASSERT_NE(std::find(shapes.begin(), shapes.end(), shape), shapes.end()) << "partial or wrong gang";
    std::optional<model::GpuClass> cls;
    std::set<std::string> distinct;
    for (const auto& na : a.nodes) {
      ASSERT_EQ(static_cast<int>(na.gpus.size()), shape.second);
      ASSERT_TRUE(distinct.insert(na.node).second);
      const auto& n = node_named(na.node);
      ASSERT_EQ(s_.node(na.node)->state, model::NodeState::Up);
      ASSERT_TRUE(s_.reachable(na.node)) << "placed on " << na.node << ", whose agent is not connected";
      for (int g : na.gpus) {
        const auto& gpu = n.gpus[static_cast<std::size_t>(g)];
        if (!cls) cls = gpu.cls;
        ASSERT_EQ(gpu.cls, *cls) << "job " << id << " mixes GPU classes";
        if (!spec.gpu.model.empty()) {
          ASSERT_TRUE(glob_match(spec.gpu.model, gpu.cls.product));
        }
        if (spec.gpu.min_memory_mib) {
          ASSERT_GE(gpu.cls.memory_mib, *spec.gpu.min_memory_mib);
        }
      }
    }
    const auto& master = node_named(a.nodes[0].node);
    EXPECT_EQ(a.master_addr, master.address);
    EXPECT_TRUE(master.ports.contains(a.master_port));
  }

  void check() {
    // The core agrees with the model built from its decisions: what is released is free.
    for (const auto& n : nodes_) {
      for (const auto& g : n.gpus) {
        auto it = held_.gpus.find({n.name, g.index});
        auto holder = s_.gpu_holder(n.name, g.index);
        if (it == held_.gpus.end()) {
          ASSERT_FALSE(holder.has_value()) << n.name << ":" << g.index << " should be free";
        } else {
          ASSERT_EQ(holder, it->second);
        }
      }
    }
    for (const auto& [key, job] : held_.ports) ASSERT_EQ(s_.port_holder(key.first, key.second), job);
    for (const auto& [id, st] : held_.states) {
      const SchedJob* j = s_.job(id);
      if (model::is_terminal(st)) {
        ASSERT_EQ(j, nullptr);
      } else {
        ASSERT_NE(j, nullptr);
        ASSERT_EQ(j->state, st);
        ASSERT_EQ(j->allocation.has_value(), model::holds_resources(st));
      }
    }
  }

  std::mt19937_64 rng_;
  Scheduler s_;
  Instant now_ = testing::at_seconds(1'000'000);
  std::vector<model::Node> nodes_;
  Held held_;
  std::map<model::JobId, std::set<std::string>> released_;  // ENDING jobs' confirmed nodes
  model::JobId next_id_ = 1;
};

class SchedulerInvariants : public ::testing::TestWithParam<int> {};

TEST_P(SchedulerInvariants, HoldNoGpuOrPortTwiceNeverMixClassesNeverSplitAGang) {
  constexpr int kSeedsPerShard = 250;
  for (int i = 0; i < kSeedsPerShard; ++i) {
    std::uint64_t seed = static_cast<std::uint64_t>(GetParam()) * kSeedsPerShard + static_cast<std::uint64_t>(i);
    SCOPED_TRACE("seed " + std::to_string(seed));
    Fuzz(seed).run(150);
    if (HasFailure()) return;
  }
}

// 4 shards x 250 seeds = 1,000 sequences of 150 steps each, plus the drain.
INSTANTIATE_TEST_SUITE_P(Shards, SchedulerInvariants, ::testing::Range(0, 4));

}  // namespace
}  // namespace corral::sched
