// The seeded cluster simulation (tests/sim) at scale: N runs of the ledger, scheduler and
// SQLite store under injected faults, spread over worker processes (threads in one
// process scaled negatively: SQLite and the allocator serialise them). Prints one table: runs,
// failures, wall time, runs/s, the load average before and after. A failing seed is
// printed and replays with `CORRAL_SIM_SEED=S build/tests/unit/ledger/ledger_test`.
//
//   build/bench/ledger_sim [--runs 100000] [--workers 2] [--first 0]

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/sim/ledger_sim.hpp"

namespace {

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 100000;
  long first = 0;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    long value = i + 1 < argc ? std::strtol(argv[i + 1], nullptr, 10) : -1;
    if (flag == "--runs" && value > 0) {
      runs = value;
    } else if (flag == "--workers" && value > 0) {
      threads = static_cast<unsigned>(value);
    } else if (flag == "--first" && value >= 0) {
      first = value;
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--workers W] [--first SEED]\n", argv[0]);
      return 2;
    }
  }
  std::string folder = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
  std::string load_before = loadavg();
  auto start = std::chrono::steady_clock::now();
  // Each worker runs seeds first + w, first + w + workers, ... and reports its totals.
  std::vector<std::pair<pid_t, int>> children;
  for (unsigned w = 0; w < threads; ++w) {
    int fds[2];
    if (::pipe(fds) != 0) return 2;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::string db = folder + "/corral-sim-bench-" + std::to_string(::getpid()) + ".db";
      long failed = 0, steps = 0, jobs = 0;
      for (long seed = first + w; seed < first + runs; seed += threads) {
        corral::sim::LedgerSim sim(static_cast<std::uint64_t>(seed), db);
        auto broken = sim.run();
        steps += sim.stats().steps;
        jobs += sim.stats().jobs;
        if (broken) {
          ++failed;
          std::fprintf(stderr, "FAILED %s\n", broken->c_str());
        }
      }
      std::string out = std::to_string(failed) + " " + std::to_string(steps) + " " + std::to_string(jobs) + "\n";
      (void)!::write(fds[1], out.data(), out.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  long failed = 0, steps = 0, jobs = 0;
  for (auto [pid, fd] : children) {
    char buf[256] = {};
    ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    long f = 0, s = 0, j = 0;
    if (n <= 0 || std::sscanf(buf, "%ld %ld %ld", &f, &s, &j) != 3) {
      std::fprintf(stderr, "a worker died (status %d)\n", status);
      return 2;
    }
    failed += f;
    steps += s;
    jobs += j;
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%-10s %-8s %-8s %-12s %-10s %-12s %-16s %-16s\n", "runs", "failed", "workers", "wall_s", "runs/s",
              "steps/s", "load_before", "load_after");
  std::printf("%-10ld %-8ld %-8u %-12.1f %-10.1f %-12.0f %-16s %-16s\n", runs, failed, threads, wall,
              static_cast<double>(runs) / wall, static_cast<double>(steps) / wall, load_before.c_str(),
              loadavg().c_str());
  std::printf("(%ld jobs submitted in all)\n", jobs);
  return failed == 0 ? 0 : 1;
}
