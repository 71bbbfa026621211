// The seeded cluster simulation (tests/sim): 1,000 runs here, 100,000 in
// bench/ledger_sim. A failure prints its seed; CORRAL_SIM_SEED=N replays that one run.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/sim/ledger_sim.hpp"

namespace corral::sim {
namespace {

// SQLite with synchronous=FULL syncs every commit: a RAM-backed folder keeps 1,000 runs
// fast without changing what is written.
std::string db_folder() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path().string();
}

std::string db_path(const std::string& tag) {
  return db_folder() + "/corral-sim-" + std::to_string(::getpid()) + "-" + tag + ".db";
}

class LedgerSimulation : public ::testing::TestWithParam<int> {};

TEST_P(LedgerSimulation, KeepsEveryPromiseUnderSeededFaults) {
  constexpr int kSeedsPerShard = 125;
  for (int i = 0; i < kSeedsPerShard; ++i) {
    std::uint64_t seed = static_cast<std::uint64_t>(GetParam()) * kSeedsPerShard + static_cast<std::uint64_t>(i);
    LedgerSim sim(seed, db_path(std::to_string(GetParam())));
    auto broken = sim.run();
    ASSERT_FALSE(broken.has_value()) << *broken << "\nreplay: CORRAL_SIM_SEED=" << seed
                                     << " build/tests/unit/ledger/ledger_test --gtest_filter='*Replay*'";
  }
}

// 8 shards x 125 seeds = 1,000 runs of 250 faulty steps each, then the quiet phase.
INSTANTIATE_TEST_SUITE_P(Shards, LedgerSimulation, ::testing::Range(0, 8));

// The same runs, fault for fault, with and without the coordinator's wall clock stepped
// (±10 s, ±1 h, while it runs): every job ends the same way, on the same attempt, for the
// same reason. Time limits, silences, graces and the queue's order run on the monotonic clock.
TEST(LedgerSimulationClock, AWallClockStepChangesNoJobsFate) {
  int stepped = 0;
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    LedgerSim with(seed, db_path("steps"));
    ASSERT_FALSE(with.run().has_value()) << "seed " << seed;
    LedgerSim without(seed, db_path("steady"), /*clock_steps=*/false);
    ASSERT_FALSE(without.run().has_value()) << "seed " << seed;
    stepped += with.stats().clock_steps;
    ASSERT_EQ(with.outcome(), without.outcome()) << "seed " << seed << " (" << with.stats().clock_steps << " steps)";
  }
  EXPECT_GT(stepped, 25) << stepped;
}

TEST(LedgerSimulationReplay, OneSeedFromTheEnvironment) {
  const char* seed = std::getenv("CORRAL_SIM_SEED");
  if (seed == nullptr) GTEST_SKIP() << "set CORRAL_SIM_SEED to replay one run";
  LedgerSim sim(std::stoull(seed), db_path("replay"));
  auto broken = sim.run();
  EXPECT_FALSE(broken.has_value()) << *broken;
  const auto& s = sim.stats();
  std::cout << "steps " << s.steps << ", jobs " << s.jobs << ", completed " << s.completed << ", coordinator crashes "
            << s.coordinator_crashes << ", agent crashes " << s.agent_crashes << ", clock steps " << s.clock_steps
            << ", store outages " << s.store_outages << "\n";
}

TEST(LedgerSimulationSanity, RunsJobsToCompletionThroughCrashes) {
  // The simulation itself must exercise what it claims to: across a few seeds, jobs
  // complete while both the coordinator and agents crash.
  SimStats total;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    LedgerSim sim(seed, db_path("sanity"));
    ASSERT_FALSE(sim.run().has_value());
    total.jobs += sim.stats().jobs;
    total.completed += sim.stats().completed;
    total.coordinator_crashes += sim.stats().coordinator_crashes;
    total.agent_crashes += sim.stats().agent_crashes;
    total.clock_steps += sim.stats().clock_steps;
    total.store_outages += sim.stats().store_outages;
  }
  EXPECT_GT(total.jobs, 100);
  EXPECT_GT(total.completed, total.jobs / 4);
  EXPECT_GT(total.coordinator_crashes, 20);
  EXPECT_GT(total.agent_crashes, 20);
  EXPECT_GT(total.clock_steps, 10);
  EXPECT_GT(total.store_outages, 10);
}

}  // namespace
}  // namespace corral::sim
