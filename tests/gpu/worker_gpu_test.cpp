// corral-worker's GPU commands. nccl-root needs no GPU (ncclGetUniqueId only opens a
// socket), so it runs everywhere CUDA and NCCL were built; preflight and nccl-check skip,
// saying why, on a machine where preflight finds no device.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/unit/worker/worker_process.hpp"

namespace corral::worker {
namespace {

using testing::Finished;
using testing::WorkerProcess;
using Env = std::map<std::string, std::string>;

Env base_env() {
  Env env;
  // NCCL picks an interface for its bootstrap socket; loopback keeps the test on this host.
  env["NCCL_SOCKET_IFNAME"] = "lo";
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) env["CUDA_VISIBLE_DEVICES"] = visible;
  return env;
}

// A job of one rank on one node.
Env one_rank_env() {
  Env env = base_env();
  for (const auto& [k, v] : Env{{"WORLD_SIZE", "1"},
                                {"RANK", "0"},
                                {"LOCAL_RANK", "0"},
                                {"LOCAL_WORLD_SIZE", "1"},
                                {"NODE_RANK", "0"},
                                {"GROUP_RANK", "0"},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", "29500"},
                                {"CORRAL_JOB_ID", "1"},
                                {"CORRAL_ATTEMPT", "0"},
                                {"CORRAL_NNODES", "1"},
                                {"CORRAL_NODELIST", "local"}}) {
    env[k] = v;
  }
  return env;
}

nlohmann::json report(const Finished& f) {
  auto json = nlohmann::json::parse(f.out, nullptr, false);
  EXPECT_FALSE(json.is_discarded()) << f.out;
  return json;
}

// Skips the calling test when preflight finds no usable GPU; returns preflight's run.
#define SKIP_WITHOUT_GPU(preflight_run)                                                          \
  do {                                                                                           \
    if ((preflight_run).exit_code == 12) {                                                       \
      GTEST_SKIP() << "no GPU visible: " << report(preflight_run).value("error", std::string()); \
    }                                                                                            \
  } while (false)

TEST(NcclRoot, PrintsAUniqueIdAndExitsWhenStdinCloses) {
  WorkerProcess root({"nccl-root"}, base_env());
  ASSERT_TRUE(root.wait_for("\n", false));
  root.close_stdin();
  Finished f = root.finish();
  EXPECT_EQ(f.exit_code, 0) << f.err;
  ASSERT_EQ(f.out.size(), 257u) << f.out << f.err;
  EXPECT_EQ(f.out.back(), '\n');
  EXPECT_EQ(f.out.find_first_not_of("0123456789abcdef"), 256u) << f.out;
}

TEST(NcclRoot, ExitsOnSigterm) {
  WorkerProcess root({"nccl-root"}, base_env());
  ASSERT_TRUE(root.wait_for("\n", false));
  ::kill(root.pid(), SIGTERM);
  EXPECT_EQ(root.finish().exit_code, 0);
}

TEST(NcclRoot, GivesADifferentIdEachTime) {
  auto id = [] {
    WorkerProcess root({"nccl-root"}, base_env());
    root.close_stdin();
    return root.finish().out;
  };
  EXPECT_NE(id(), id());
}

TEST(Preflight, ChecksEveryVisibleDevice) {
  Finished f = WorkerProcess({"preflight"}, base_env()).finish();
  SKIP_WITHOUT_GPU(f);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  auto json = report(f);
  EXPECT_EQ(json["ok"], true);
  ASSERT_GE(json["device_count"].get<int>(), 1);
  for (const auto& device : json["devices"]) {
    EXPECT_EQ(device["ok"], true) << device.dump();
    EXPECT_EQ(device["kernel"], "ok") << device.dump();
    EXPECT_GT(device["total_memory_bytes"].get<std::uint64_t>(), 0u);
  }
}

TEST(NcclCheck, OneRankAllReducesCorrectly) {
  Finished pre = WorkerProcess({"preflight"}, base_env()).finish();
  SKIP_WITHOUT_GPU(pre);
  // The root must live while the rank initialises, as it does for a job.
  WorkerProcess root({"nccl-root"}, base_env());
  ASSERT_TRUE(root.wait_for("\n", false));
  Env env = one_rank_env();
  env["CORRAL_NCCL_UNIQUE_ID"] = root.stdout_text().substr(0, 256);
  Finished f = WorkerProcess({"nccl-check", "--max-bytes", "4194304", "--iters", "5", "--timeout", "60"}, env)
                   .finish(std::chrono::seconds(120));
  root.close_stdin();
  EXPECT_EQ(root.finish().exit_code, 0);
  ASSERT_EQ(f.exit_code, 0) << f.err << f.out;
  auto json = report(f);
  EXPECT_EQ(json["ok"], true);
  EXPECT_EQ(json["world_size"], 1);
  ASSERT_FALSE(json["results"].empty());
  EXPECT_EQ(json["results"].back()["bytes"], 4194304);
  for (const auto& row : json["results"]) {
    EXPECT_EQ(row["correct"], true) << row.dump();
    // One rank moves nothing over a bus: nccl-tests' factor 2 (n - 1) / n is 0.
    EXPECT_EQ(row["busbw_gbps"], 0.0) << row.dump();
  }
}

TEST(NcclCheck, RefusesAMalformedUniqueId) {
  Env env = one_rank_env();
  env["CORRAL_NCCL_UNIQUE_ID"] = "abc";
  Finished f = WorkerProcess({"nccl-check"}, env).finish();
  EXPECT_EQ(f.exit_code, 3);
  EXPECT_EQ(report(f)["error"], "CORRAL_NCCL_UNIQUE_ID: an NCCL unique ID has 256 hex characters, not 3");
}

}  // namespace
}  // namespace corral::worker
