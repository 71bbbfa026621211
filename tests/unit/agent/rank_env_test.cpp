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
  return l;
}

std::map<std::string, std::string> as_map(const Env& env) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : env) m[k] = v;
  return m;
}

TEST(RankEnv, CarriesTheEnvContractOfInitProcessGroup) {
  auto l = two_by_two();
  auto env = as_map(build_rank_env(l, {3, 1, 1, {5}}, {"eth0"}, {{"PATH", "/usr/bin"}}));
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "5");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.11");
  EXPECT_EQ(env["MASTER_PORT"], "29501");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(env["NODE_RANK"], "1");
  EXPECT_EQ(env["GROUP_RANK"], "1");
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
