// One scheduling pass of the pure core, at lab scale and far beyond it.
//   build/bench/sched_bench --benchmark_counters_tabular=true
// Nodes have 8 GPUs in 4 classes (two products, two memory sizes, two drivers); pending
// jobs mix 1-8 GPU single-node jobs, 2-4 node gangs, class constraints and time limits.
// "Fresh": the cluster is idle and the pass fills it. "Busy": the cluster is full and
// every pending job is checked and given a reason, which is what most passes do.

#include <benchmark/benchmark.h>

#include <optional>
#include <random>

#include "coordinator/sched/scheduler.hpp"

namespace corral::sched {
namespace {

using namespace std::chrono_literals;

const model::GpuClass kClasses[] = {{"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"},
                                    {"NVIDIA A100-SXM4-40GB", 40960, "550.54.15"},
                                    {"NVIDIA A100-SXM4-80GB", 81920, "535.104.05"},
                                    {"NVIDIA H100 80GB HBM3", 81920, "550.54.15"}};

Scheduler make_cluster(int nodes, Instant now) {
  Scheduler s;
  for (int n = 0; n < nodes; ++n) {
    model::Node node;
    node.name = "node" + std::to_string(n);
    node.address = "10." + std::to_string(n / 250) + "." + std::to_string(n % 250) + ".1";
    node.state = model::NodeState::Up;
    const auto& cls = kClasses[n % 4];
    for (int g = 0; g < 8; ++g) {
      model::Gpu gpu;
      gpu.index = g;
      gpu.cls = cls;
      gpu.cuda = {12, 4};
      for (int p = 0; p < 8; ++p) {
        if (p != g && (p < 4) == (g < 4)) gpu.nvlink_peers.push_back(p);
      }
      node.gpus.push_back(gpu);
    }
    (void)s.update_node(node, now);
  }
  return s;
}

model::JobSpec random_spec(std::mt19937_64& rng) {
  model::JobSpec spec;
  spec.name = "bench";
  spec.command.argv = {"true"};
  int kind = std::uniform_int_distribution<int>(0, 9)(rng);
  if (kind < 7) {
    spec.nodes = 1;
    spec.gpus_per_node = 1 << std::uniform_int_distribution<int>(0, 3)(rng);
  } else if (kind < 9) {
    spec.nodes = std::uniform_int_distribution<int>(2, 4)(rng);
    spec.gpus_per_node = 8;
  } else {
    spec.total_gpus = 16;
  }
  if (std::uniform_int_distribution<int>(0, 4)(rng) == 0) spec.gpu.model = "NVIDIA H100*";
  if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) spec.time_limit = std::chrono::minutes(30 + kind * 10);
  spec.priority = std::uniform_int_distribution<int>(0, 2)(rng);
  return spec;
}

void add_pending(Scheduler& s, int jobs, model::JobId first_id, Instant now, std::mt19937_64& rng) {
  for (int j = 0; j < jobs; ++j) {
    (void)s.add_pending(first_id + j, "user" + std::to_string(j % 12), random_spec(rng), now);
  }
}

void BM_PassFresh(benchmark::State& state) {
  int nodes = static_cast<int>(state.range(0));
  int jobs = static_cast<int>(state.range(1));
  Instant now(std::chrono::seconds(1'700'000'000));
  std::mt19937_64 rng(42);
  Scheduler base = make_cluster(nodes, now);
  add_pending(base, jobs, 1, now, rng);
  int started = 0;
  std::optional<Scheduler> s;
  for (auto _ : state) {
    // Copying and destroying the state is not part of a pass.
    state.PauseTiming();
    s.reset();
    s.emplace(base);
    state.ResumeTiming();
    auto decisions = s->schedule(now + 1s);
    benchmark::DoNotOptimize(decisions);
    started = s->last_pass().started;
    state.PauseTiming();
    decisions.clear();
    state.ResumeTiming();
  }
  state.counters["started"] = started;
}

void BM_PassBusy(benchmark::State& state) {
  int nodes = static_cast<int>(state.range(0));
  int jobs = static_cast<int>(state.range(1));
  Instant now(std::chrono::seconds(1'700'000'000));
  std::mt19937_64 rng(7);
  Scheduler base = make_cluster(nodes, now);
  // Fill the cluster with single-GPU jobs, then queue the pending load behind them.
  add_pending(base, 0, 1, now, rng);
  model::JobId id = 1;
  for (int n = 0; n < nodes * 8; ++n) {
    model::JobSpec filler;
    filler.name = "filler";
    filler.command.argv = {"true"};
    filler.nodes = 1;
    filler.gpus_per_node = 1;
    filler.time_limit = std::chrono::hours(1 + n % 5);
    (void)base.add_pending(id++, "filler", filler, now);
  }
  (void)base.schedule(now);
  add_pending(base, jobs, id, now, rng);
  int considered = 0;
  std::optional<Scheduler> s;
  for (auto _ : state) {
    state.PauseTiming();
    s.reset();
    s.emplace(base);
    state.ResumeTiming();
    auto decisions = s->schedule(now + 1s);
    benchmark::DoNotOptimize(decisions);
    considered = s->last_pass().considered;
    state.PauseTiming();
    decisions.clear();
    state.ResumeTiming();
  }
  state.counters["considered"] = considered;
}

void Args(benchmark::internal::Benchmark* b) {
  for (int nodes : {32, 256, 1024}) {
    for (int jobs : {100, 1000, 10000}) b->Args({nodes, jobs});
  }
  b->ArgNames({"nodes", "pending"})->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_PassFresh)->Apply(Args);
BENCHMARK(BM_PassBusy)->Apply(Args);

}  // namespace
}  // namespace corral::sched

BENCHMARK_MAIN();
