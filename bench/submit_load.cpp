// Submission throughput against a running coordinator: N clients on keep-alive TLS
// connections submit M jobs in all, then (optionally) the `corral submit` command is run
// serially K times. Prints a table. bench/submit_throughput.sh sets everything up.
//
//   submit_load --url https://127.0.0.1:PORT --ca CA --token TOKEN [--clients 8]
//               [--jobs 10000] [--cli build/cli/corral --cli-runs 200 --spec FILE]

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/net/http_client.hpp"

using namespace corral;
using SteadyClock = std::chrono::steady_clock;

namespace {

std::string arg(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return dflt;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = arg(argc, argv, "--url", "");
  std::string ca = arg(argc, argv, "--ca", "");
  std::string token = arg(argc, argv, "--token", "");
  int clients = std::stoi(arg(argc, argv, "--clients", "8"));
  int jobs = std::stoi(arg(argc, argv, "--jobs", "10000"));
  std::string cli = arg(argc, argv, "--cli", "");
  int cli_runs = std::stoi(arg(argc, argv, "--cli-runs", "200"));
  std::string spec_file = arg(argc, argv, "--spec", "");
  if (url.empty() || ca.empty() || token.empty()) {
    std::fprintf(stderr, "usage: submit_load --url URL --ca CA --token TOKEN [...]\n");
    return 2;
  }
  const std::string spec = "name: load\ncommand: [\"true\"]\nresources:\n  gpus_per_node: 1\n";
  const std::string body = nlohmann::json{{"spec", spec}, {"file", "load.yaml"}}.dump();
  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(clients));
  auto t0 = SteadyClock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = net::HttpClient::create(url, {ca, "", ""});
      if (!client) {
        ++failures;
        return;
      }
      while (next.fetch_add(1) < jobs) {
        auto s = SteadyClock::now();
        auto r = (*client)->request("POST", "/v1/jobs", body, {{"Authorization", "Bearer " + token}});
        latencies[static_cast<std::size_t>(c)].push_back(std::chrono::duration<double, std::milli>(SteadyClock::now() - s).count());
        if (!r || r->status != 201) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::printf("| measurement | value |\n| --- | ---: |\n");
  std::printf("| clients (keep-alive TLS) | %d |\n", clients);
  std::printf("| jobs submitted and acknowledged | %d |\n", jobs - failures.load());
  std::printf("| failures | %d |\n", failures.load());
  std::printf("| wall time | %.2f s |\n", secs);
  std::printf("| throughput | %.0f jobs/s |\n", (jobs - failures.load()) / secs);
  std::printf("| request latency p50 / p99 | %.2f / %.2f ms |\n", percentile(all, 0.5), percentile(all, 0.99));
  if (!cli.empty() && !spec_file.empty()) {
    std::vector<double> runs;
    int cli_failures = 0;
    for (int i = 0; i < cli_runs; ++i) {
      auto s = SteadyClock::now();
      pid_t pid = fork();
      if (pid == 0) {
        int devnull = ::open("/dev/null", 1);
        ::dup2(devnull, 1);
        execl(cli.c_str(), cli.c_str(), "submit", spec_file.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      runs.push_back(std::chrono::duration<double, std::milli>(SteadyClock::now() - s).count());
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++cli_failures;
    }
    std::printf("| `corral submit` runs (serial) | %d (%d failed) |\n", cli_runs, cli_failures);
    std::printf("| `corral submit` median / p90 | %.1f / %.1f ms |\n", percentile(runs, 0.5), percentile(runs, 0.9));
    std::printf("| `corral submit` mean | %.1f ms |\n", mean(runs));
    std::printf("| `corral submit` serial rate | %.0f jobs/s |\n", 1000.0 / percentile(runs, 0.5));
  }
  return failures.load() == 0 ? 0 : 1;
}
