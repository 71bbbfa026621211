#include "common/model/config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace corral::model {
namespace {

using namespace std::chrono_literals;

TEST(CoordinatorConfig, TheShippedExampleLoads) {
  auto c = load_coordinator_config(std::string(CORRAL_SOURCE_DIR) + "/configs/coordinator.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->listen_port, 7433);
  EXPECT_EQ(c->listen_host, "0.0.0.0");
  EXPECT_EQ(c->node_timeout, 5s);
  EXPECT_EQ(c->node_lost_timeout, 5min);
  EXPECT_EQ(c->database_path(), "/var/lib/corral/corral.db");
}

TEST(AgentConfig, TheShippedExampleLoads) {
  auto c = load_agent_config(std::string(CORRAL_SOURCE_DIR) + "/configs/agent.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->node, "gpu-a");
  EXPECT_EQ(c->ports, (PortRange{29500, 29999}));
  EXPECT_FALSE(c->allow_root_jobs);
  EXPECT_EQ(c->rank_log_cap, std::uint64_t{1} << 30);
}

TEST(AgentConfig, TheRankLogCapIsASizeWithinItsRange) {
  const std::string base = "node: a\ncoordinator: https://127.0.0.1:1\nca: c\ncert: c\nkey: k\nadvertise: 127.0.0.1\n";
  auto c = parse_agent_config(base + "rank_log_cap: 64KiB\n", "a.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->rank_log_cap, 65536u);
  c = parse_agent_config(base + "rank_log_cap: 3 GiB\n", "a.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->rank_log_cap, std::uint64_t{3} << 30);
  for (const char* bad : {"1000", "2TB", "lots", "99999999999999999999GiB"}) {
    c = parse_agent_config(base + "rank_log_cap: " + bad + "\n", "a.yaml");
    ASSERT_FALSE(c.has_value()) << bad;
    EXPECT_EQ(c.error().message(), std::string("a.yaml:7:15: rank_log_cap: must be a size from 64KiB to 1024GiB "
                                               "(bytes, or a number with KiB, MiB or GiB), got \"") + bad + "\"");
  }
}

TEST(CoordinatorConfig, ListsEveryProblemWithItsPosition) {
  auto c = parse_coordinator_config("listen: nowhere\nnode_timout: 5s\nkill_grace: soon\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(),
            "c.yaml:1:9: listen: must be HOST:PORT, got \"nowhere\"\n"
            "c.yaml:2:1: \"node_timout\": unknown setting; did you mean \"node_timeout\"?\n"
            "c.yaml:3:13: kill_grace: expected a duration like 90s, 30m, 2h or 1d, got \"soon\"");
}

TEST(CoordinatorConfig, PrivateDataIsEmptyByDefault) {
  auto c = parse_coordinator_config("listen: 127.0.0.1:0\n", "c.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_FALSE(c->private_data.any());
  auto empty = parse_coordinator_config("private_data: []\n", "c.yaml");
  ASSERT_TRUE(empty.has_value()) << empty.error().message();
  EXPECT_FALSE(empty->private_data.any());
}

TEST(CoordinatorConfig, PrivateDataTakesAListOfHistoryUsageAndJobs) {
  auto flow = parse_coordinator_config("private_data: [history, jobs]\n", "c.yaml");
  ASSERT_TRUE(flow.has_value()) << flow.error().message();
  EXPECT_TRUE(flow->private_data.history);
  EXPECT_FALSE(flow->private_data.usage);
  EXPECT_TRUE(flow->private_data.jobs);
  auto block = parse_coordinator_config("private_data:\n  - usage\n", "c.yaml");
  ASSERT_TRUE(block.has_value()) << block.error().message();
  EXPECT_FALSE(block->private_data.history);
  EXPECT_TRUE(block->private_data.usage);
  EXPECT_FALSE(block->private_data.jobs);
}

TEST(CoordinatorConfig, PrivateDataNamesAnUnknownItem) {
  auto c = parse_coordinator_config("private_data: [jobs, histroy]\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "c.yaml:1:15: private_data: unknown item \"histroy\"; use history, usage or jobs");
}

TEST(CoordinatorConfig, PrivateDataMustBeAListOfNames) {
  auto scalar = parse_coordinator_config("private_data: history\n", "c.yaml");
  ASSERT_FALSE(scalar.has_value());
  EXPECT_EQ(scalar.error().message(), "c.yaml:1:15: private_data: must be a list, like [a, b]");
  auto map = parse_coordinator_config("private_data: {history: true}\n", "c.yaml");
  ASSERT_FALSE(map.has_value());
  EXPECT_EQ(map.error().message(), "c.yaml:1:15: private_data: must be a list, like [a, b]");
  auto nested = parse_coordinator_config("private_data: [[history]]\n", "c.yaml");
  ASSERT_FALSE(nested.has_value());
  EXPECT_EQ(nested.error().message(), "c.yaml:1:16: private_data: each item must be a single value");
}

TEST(CoordinatorConfig, PortZeroMeansAnyFreePort) {
  auto c = parse_coordinator_config("listen: 127.0.0.1:0\n", "c.yaml");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->listen_port, 0);
  EXPECT_EQ(c->listen_host, "127.0.0.1");
}

TEST(CoordinatorConfig, NodeTimeoutMustExceedTheHeartbeat) {
  auto c = parse_coordinator_config("heartbeat_interval: 5s\nnode_timeout: 2s\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "c.yaml: node_timeout must be longer than heartbeat_interval");
}

TEST(CoordinatorConfig, NodeLostTimeoutMustBeAtLeastTheNodeTimeout) {
  auto c = parse_coordinator_config("node_timeout: 10s\nnode_lost_timeout: 9s\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "c.yaml: node_lost_timeout (9s) must be at least node_timeout (10s)");
  auto equal = parse_coordinator_config("node_timeout: 10s\nnode_lost_timeout: 10s\n", "c.yaml");
  ASSERT_TRUE(equal.has_value()) << equal.error().message();
  EXPECT_EQ(equal->node_lost_timeout, 10s);
}

TEST(CoordinatorConfig, NodeLostTimeoutLeftOutFollowsALongerNodeTimeout) {
  auto c = parse_coordinator_config("node_timeout: 10m\n", "c.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->node_lost_timeout, 10min);
  auto d = parse_coordinator_config("node_timeout: 3s\n", "c.yaml");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->node_lost_timeout, 5min);
}

TEST(AgentConfig, RequiredSettingsAndBadValuesAreNamed) {
  auto c = parse_agent_config("node: gpu a\nports: 30000-29000\nallow_root_jobs: maybe\n", "a.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(),
            "a.yaml:1:7: node: must be 1 to 64 of [A-Za-z0-9._-], got \"gpu a\"\n"
            "a.yaml:2:8: ports: must be FIRST-LAST with 1 <= FIRST <= LAST <= 65535, got \"30000-29000\"\n"
            "a.yaml:3:18: allow_root_jobs: must be true or false, got \"maybe\"\n"
            "a.yaml: coordinator: required setting is missing\n"
            "a.yaml: ca: required setting is missing\n"
            "a.yaml: cert: required setting is missing\n"
            "a.yaml: key: required setting is missing\n"
            "a.yaml: advertise: required setting is missing");
}

TEST(AgentConfig, RelativePathsAreRelativeToTheFile) {
  std::string dir = std::filesystem::temp_directory_path() / "corral-config-test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/agent.yaml");
    f << "node: a\ncoordinator: https://127.0.0.1:1\nca: certs/ca.pem\ncert: /abs/a.pem\nkey: certs/a.key\n"
         "advertise: 127.0.0.1\nspool: spool\nsimulate: ../sim/x.yaml\n";
  }
  auto c = load_agent_config(dir + "/agent.yaml");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->ca, dir + "/certs/ca.pem");
  EXPECT_EQ(c->cert, "/abs/a.pem");
  EXPECT_EQ(c->simulate, std::filesystem::path(dir).parent_path().string() + "/sim/x.yaml");
}

TEST(Configs, NonYamlDocumentsAreRefused) {
  EXPECT_FALSE(parse_coordinator_config("- a\n- b\n", "c.yaml").has_value());
  EXPECT_FALSE(parse_coordinator_config("listen: [1, 2]\n", "c.yaml").has_value());
  EXPECT_FALSE(parse_coordinator_config("listen: \"unterminated\n", "c.yaml").has_value());
  EXPECT_FALSE(load_coordinator_config("/nonexistent/c.yaml").has_value());
}

}  // namespace
}  // namespace corral::model
