// What `corral queue` does with a long answer, apart from the network: parse the job list
// the coordinator sends (the shape of GET /v1/jobs) and format the table.
//
//   build/bench/cli_list_bench --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>

#include <string>

#include "cli/format.hpp"
#include "cli/views.hpp"
#include "common/core/time.hpp"
#include "common/protocol/json_reader.hpp"

namespace {

// N pending jobs as GET /v1/jobs answers them (every field, as the coordinator writes it).
std::string job_list(int n) {
  std::string out = "[";
  for (int i = 0; i < n; ++i) {
    if (i > 0) out += ",";
    out += R"({"array":null,"attempt":0,"dependencies":[],"detail":"waiting behind job 2; 1 GPUs of one class needed, 0 matching GPUs free","ended_at":null,"exit_code":null,"failed_node":"","failed_rank":null,"fences":[],"gpus":1,"id":)" +
           std::to_string(i + 3) +
           R"(,"master_addr":null,"master_port":null,"name":"queued","node_list":[],"nodes":1,"outcome":null,"priority":0,"ranks":[],"reason":"Priority","rendezvous":null,"retries":0,"started_at":null,"state":"PENDING","submitted_at":"2026-12-05T07:44:16.542Z","time_limit":null,"user":"root","waiting_for":[]})";
  }
  return out + "]";
}

void BM_ParseJobs(benchmark::State& state) {
  const std::string body = job_list(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto jobs = corral::cli::parse_jobs(body);
    benchmark::DoNotOptimize(jobs);
  }
  state.counters["MB"] = static_cast<double>(body.size()) / 1e6;
}

// The JSON parse alone, of the same text.
void BM_ParseJsonOnly(benchmark::State& state) {
  const std::string body = job_list(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto json = corral::protocol::parse_json(body, body.size());
    benchmark::DoNotOptimize(json);
  }
}

void BM_FormatQueue(benchmark::State& state) {
  auto jobs = corral::cli::parse_jobs(job_list(static_cast<int>(state.range(0))));
  const auto now = *corral::parse_rfc3339("2026-12-05T08:00:00.000Z");
  for (auto _ : state) {
    auto text = corral::cli::format_queue(*jobs, now);
    benchmark::DoNotOptimize(text);
  }
}

}  // namespace

BENCHMARK(BM_ParseJobs)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseJsonOnly)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FormatQueue)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
