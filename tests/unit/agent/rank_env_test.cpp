#include "agent/rank_env.hpp"

#include <gtest/gtest.h>

#include <map>

namespace corral::agent {
namespace {

protocol::Launch two_by_two() {
  protocol::Launch l;
  l.job = 42;
  l.attempt = 1;
  l.name = "ddp";
  l.nodes = {"gpu-a", "gpu-b"};
  l.world_size = 4;
  l.local_world_size = 2;
  l.master_addr = "10.0.0.11";
  l.master_port = 29501;
  l.max_restarts = 2;
  l.ranks = {{2, 0, 1, {4}}, {3, 1, 1, {5}}};  // gpu-b's
  return l;
}

std::map<std::string, std::string> as_map(const Env& env) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : env) m[k] = v;
  return m;
}

TEST(RankEnv, CarriesTheEnvContractOfInitProcessGroup) {
  auto l = two_by_two();
  auto env = as_map(build_rank_env(l, l.ranks[1], {"eth0"}, {{"PATH", "/usr/bin"}}));
  // torchrun's contract: every local rank sees the node's GPUs; LOCAL_RANK indexes them.
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "4,5");
  EXPECT_EQ(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.11");
  EXPECT_EQ(env["MASTER_PORT"], "29501");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(env["NODE_RANK"], "1");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_RANK"], "3");
  EXPECT_EQ(env["ROLE_NAME"], "default");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");  // the attempt
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "42");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["CORRAL_JOB_ID"], "42");
  EXPECT_EQ(env["CORRAL_ATTEMPT"], "1");
  EXPECT_EQ(env["CORRAL_NNODES"], "2");
  EXPECT_EQ(env["CORRAL_NODELIST"], "gpu-a,gpu-b");
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "eth0");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth0");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env.count("CORRAL_NCCL_UNIQUE_ID"), 0u);
}

TEST(RankEnv, TheJobMayChooseItsInterfaceAndThreads) {
  auto l = two_by_two();
  l.env = {{"GLOO_SOCKET_IFNAME", "ib0"}, {"OMP_NUM_THREADS", "8"}, {"NCCL_DEBUG", "INFO"}};
  auto env = as_map(build_rank_env(l, {0, 0, 0, {0}}, {"eth0"}, {}));
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "ib0");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth0");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "8");
  EXPECT_EQ(env["NCCL_DEBUG"], "INFO");
}

TEST(RankEnv, EveryRankOfANodeSeesItsGpusInOneOrderOrOnlyItsOwnWhenAsked) {
  auto l = two_by_two();
  l.ranks = {{3, 1, 1, {6, 7}}, {2, 0, 1, {2, 3}}};  // listed out of order, two GPUs each
  EXPECT_EQ(as_map(build_rank_env(l, l.ranks[0], {""}, {}))["CUDA_VISIBLE_DEVICES"], "2,3,6,7");
  EXPECT_EQ(as_map(build_rank_env(l, l.ranks[1], {""}, {}))["CUDA_VISIBLE_DEVICES"], "2,3,6,7");
  l.gpus_per_rank = true;
  EXPECT_EQ(as_map(build_rank_env(l, l.ranks[0], {""}, {}))["CUDA_VISIBLE_DEVICES"], "6,7");
  EXPECT_EQ(as_map(build_rank_env(l, l.ranks[0], {""}, {}))["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
}

TEST(RankEnv, TheExportedEnvironmentAndEnvComeOverTheLoginOnesAndCorralsOverAll) {
  auto l = two_by_two();
  l.env = {{"PATH", "/venv/bin:/usr/bin"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}};
  auto env = build_rank_env(l, l.ranks[0], {""}, {{"PATH", "/usr/bin:/bin"}, {"HOME", "/home/alice"}});
  auto m = as_map(env);
  EXPECT_EQ(m["PATH"], "/venv/bin:/usr/bin");
  EXPECT_EQ(m["HOME"], "/home/alice");
  EXPECT_EQ(m["NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(m.size(), env.size()) << "a variable set twice";
}

TEST(RankEnv, OneRankPerNodeKeepsOmpThreadsAndSeesAllItsGpus) {
  auto l = two_by_two();
  l.local_world_size = 1;
  l.world_size = 2;
  l.nccl_id = std::string(256, 'a');
  auto env = as_map(build_rank_env(l, {1, 0, 1, {0, 1, 2, 3}}, {""}, {}));
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "0,1,2,3");
  EXPECT_EQ(env["CORRAL_NCCL_UNIQUE_ID"], std::string(256, 'a'));
  EXPECT_EQ(env.count("GLOO_SOCKET_IFNAME"), 0u);  // unknown interface: leave it to the job
}

TEST(RankEnv, FindsTheInterfaceOfAnAddress) {
  EXPECT_EQ(interface_for_address("127.0.0.1").value_or(""), "lo");
  EXPECT_FALSE(interface_for_address("192.0.2.123").has_value());
  EXPECT_FALSE(interface_for_address("not an address").has_value());
}

}  // namespace
}  // namespace corral::agent
