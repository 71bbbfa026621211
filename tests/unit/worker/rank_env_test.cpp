#include "worker/rank_env.hpp"

#include <gtest/gtest.h>

namespace corral::worker {
namespace {

// Rank 3 of a job on two nodes with two ranks each: what the agent sets.
EnvMap good_env() {
  return {
      {"WORLD_SIZE", "4"},
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"NODE_RANK", "1"},
      {"GROUP_RANK", "1"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29500"},
      {"CORRAL_JOB_ID", "42"},
      {"CORRAL_ATTEMPT", "1"},
      {"CORRAL_NNODES", "2"},
      {"CORRAL_NODELIST", "gpu1,gpu2"},
      {"CUDA_VISIBLE_DEVICES", "5"},
  };
}

EnvMap with(EnvMap env, const std::string& key, const std::string& value) {
  env[key] = value;
  return env;
}

EnvMap without(EnvMap env, const std::string& key) {
  env.erase(key);
  return env;
}

std::string error_of(const EnvMap& env, RankEnvOptions options = {}) {
  auto parsed = parse_rank_env(env, options);
  if (parsed) return "(no error)";
  EXPECT_EQ(parsed.error().code(), ErrorCode::InvalidArgument);
  return parsed.error().message();
}

TEST(RankEnv, ReadsEveryVariableTheAgentSets) {
  auto env = parse_rank_env(good_env());
  ASSERT_TRUE(env.has_value()) << env.error().message();
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->node_rank, 1);
  EXPECT_EQ(env->group_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->job_id, 42);
  EXPECT_EQ(env->attempt, 1);
  EXPECT_EQ(env->nnodes, 2);
  EXPECT_EQ(env->nodelist, (std::vector<std::string>{"gpu1", "gpu2"}));
  EXPECT_EQ(env->cuda_visible_devices, "5");
  EXPECT_EQ(env->visible_devices, (std::vector<std::string>{"5"}));
}

TEST(RankEnv, ListsEveryMissingVariableAtOnce) {
  EXPECT_EQ(error_of(without(without(good_env(), "RANK"), "MASTER_PORT")),
            "missing environment: RANK, MASTER_PORT");
}

TEST(RankEnv, CountsAnEmptyValueAsMissing) {
  EXPECT_EQ(error_of(with(good_env(), "MASTER_ADDR", "")), "missing environment: MASTER_ADDR");
}

TEST(RankEnv, RefusesANumberWithASignOrSpaces) {
  EXPECT_EQ(error_of(with(good_env(), "RANK", "x")), "RANK=\"x\" is not a non-negative integer");
  EXPECT_EQ(error_of(with(good_env(), "RANK", "-1")), "RANK=\"-1\" is not a non-negative integer");
  EXPECT_EQ(error_of(with(good_env(), "WORLD_SIZE", " 4")),
            "WORLD_SIZE=\" 4\" is not a non-negative integer");
}

TEST(RankEnv, RefusesAWorldLargerThanCorralSupports) {
  EXPECT_EQ(error_of(with(good_env(), "WORLD_SIZE", "5000")), "WORLD_SIZE=5000 is too large (at most 4096)");
}

TEST(RankEnv, RefusesAnEmptyWorld) {
  EXPECT_EQ(error_of(with(good_env(), "WORLD_SIZE", "0")), "WORLD_SIZE=0 must be at least 1");
}

TEST(RankEnv, RefusesAPortOutOfRange) {
  EXPECT_EQ(error_of(with(good_env(), "MASTER_PORT", "70000")),
            "MASTER_PORT=70000 is not a port number (1-65535)");
  EXPECT_EQ(error_of(with(good_env(), "MASTER_PORT", "0")), "MASTER_PORT=0 is not a port number (1-65535)");
}

TEST(RankEnv, RefusesAMasterAddressWithSpaces) {
  EXPECT_EQ(error_of(with(good_env(), "MASTER_ADDR", "10.0.0.1 x")),
            "MASTER_ADDR=\"10.0.0.1 x\" is not a host name or IP address");
}

TEST(RankEnv, AcceptsIpv6AndHostNames) {
  EXPECT_TRUE(parse_rank_env(with(good_env(), "MASTER_ADDR", "fe80::1%eth0")).has_value());
  EXPECT_TRUE(parse_rank_env(with(good_env(), "MASTER_ADDR", "gpu1.lab.example")).has_value());
}

TEST(RankEnv, RefusesARankOutsideTheWorld) {
  EXPECT_EQ(error_of(with(good_env(), "RANK", "7")), "WORLD_SIZE=4 but RANK=7");
}

TEST(RankEnv, RefusesALocalRankOutsideTheNode) {
  EXPECT_EQ(error_of(with(good_env(), "LOCAL_RANK", "2")), "LOCAL_WORLD_SIZE=2 but LOCAL_RANK=2");
}

TEST(RankEnv, RefusesANodeRankOutsideTheNodeList) {
  EXPECT_EQ(error_of(with(with(good_env(), "NODE_RANK", "2"), "GROUP_RANK", "2")),
            "CORRAL_NNODES=2 but NODE_RANK=2");
}

TEST(RankEnv, RefusesAGroupRankThatIsNotTheNodeRank) {
  EXPECT_EQ(error_of(with(good_env(), "GROUP_RANK", "0")), "GROUP_RANK=0 but NODE_RANK=1");
}

TEST(RankEnv, RefusesAWorldSizeThatIsNotNodesTimesLocalRanks) {
  EXPECT_EQ(error_of(with(good_env(), "WORLD_SIZE", "8")),
            "WORLD_SIZE=8 but CORRAL_NNODES=2 * LOCAL_WORLD_SIZE=2 = 4");
}

TEST(RankEnv, RefusesARankThatDoesNotFollowFromNodeAndLocalRank) {
  EXPECT_EQ(error_of(with(good_env(), "RANK", "2")),
            "RANK=2 but NODE_RANK=1 * LOCAL_WORLD_SIZE=2 + LOCAL_RANK=1 = 3");
}

TEST(RankEnv, RefusesANodeListOfTheWrongLength) {
  EXPECT_EQ(error_of(with(good_env(), "CORRAL_NODELIST", "gpu1")),
            "CORRAL_NODELIST names 1 node but CORRAL_NNODES=2");
  EXPECT_EQ(error_of(with(good_env(), "CORRAL_NODELIST", "a,b,c")),
            "CORRAL_NODELIST names 3 nodes but CORRAL_NNODES=2");
}

TEST(RankEnv, RefusesEmptyOrRepeatedNodeNames) {
  EXPECT_EQ(error_of(with(good_env(), "CORRAL_NODELIST", "gpu1,")),
            "CORRAL_NODELIST=\"gpu1,\" has an empty node name");
  EXPECT_EQ(error_of(with(good_env(), "CORRAL_NODELIST", "gpu1,gpu1")),
            "CORRAL_NODELIST names \"gpu1\" twice");
}

TEST(RankEnv, LeavesTheDeviceCountUncheckedWithoutTheFlag) {
  EXPECT_TRUE(parse_rank_env(without(good_env(), "CUDA_VISIBLE_DEVICES")).has_value());
  EXPECT_TRUE(parse_rank_env(with(good_env(), "CUDA_VISIBLE_DEVICES", "")).has_value());
  EXPECT_TRUE(parse_rank_env(with(good_env(), "CUDA_VISIBLE_DEVICES", "0,1,GPU-8d6f")).has_value());
}

TEST(RankEnv, TellsAnUnsetDeviceListFromAnEmptyOne) {
  EXPECT_FALSE(parse_rank_env(without(good_env(), "CUDA_VISIBLE_DEVICES"))->cuda_visible_devices.has_value());
  EXPECT_EQ(parse_rank_env(with(good_env(), "CUDA_VISIBLE_DEVICES", ""))->cuda_visible_devices, "");
}

TEST(RankEnv, ChecksTheDeviceCountAgainstGpusPerRank) {
  EXPECT_TRUE(parse_rank_env(good_env(), {.gpus_per_rank = 1}).has_value());
  EXPECT_EQ(error_of(with(good_env(), "CUDA_VISIBLE_DEVICES", "0,1"), {.gpus_per_rank = 1}),
            "CUDA_VISIBLE_DEVICES=\"0,1\" lists 2 devices but --gpus-per-rank 1");
  EXPECT_EQ(error_of(with(good_env(), "CUDA_VISIBLE_DEVICES", ""), {.gpus_per_rank = 2}),
            "CUDA_VISIBLE_DEVICES=\"\" lists 0 devices but --gpus-per-rank 2");
  EXPECT_EQ(error_of(without(good_env(), "CUDA_VISIBLE_DEVICES"), {.gpus_per_rank = 1}),
            "CUDA_VISIBLE_DEVICES is not set but --gpus-per-rank 1");
}

TEST(RankEnv, AcceptsNoDevicesWhenZeroPerRankAreExpected) {
  EXPECT_TRUE(parse_rank_env(without(good_env(), "CUDA_VISIBLE_DEVICES"), {.gpus_per_rank = 0}).has_value());
  EXPECT_TRUE(parse_rank_env(with(good_env(), "CUDA_VISIBLE_DEVICES", ""), {.gpus_per_rank = 0}).has_value());
}

TEST(RankEnv, RefusesEmptyOrRepeatedDevices) {
  EXPECT_EQ(error_of(with(good_env(), "CUDA_VISIBLE_DEVICES", "0,,1")),
            "CUDA_VISIBLE_DEVICES=\"0,,1\" has an empty entry");
  EXPECT_EQ(error_of(with(good_env(), "CUDA_VISIBLE_DEVICES", "3,3")),
            "CUDA_VISIBLE_DEVICES names \"3\" twice");
}

}  // namespace
}  // namespace corral::worker
