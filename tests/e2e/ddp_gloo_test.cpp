// Real PyTorch DDP (gloo, CPU) across two hosts in network namespaces: the example job in
// configs/examples/ddp-gloo.yaml, submitted with the corral CLI as a person would, with
// nothing set by hand; and the same job with gloo on loopback, which cannot work. Needs
// Debian's python3-torch; skips with the reason without it.

#include <sstream>

#include <netdb.h>

#include "common/model/job_spec_yaml.hpp"
#include "tests/e2e/netns_cluster.hpp"

namespace corral::e2e {
namespace {

// The interpreter configs/examples/ddp-gloo.yaml runs: Debian's, which python3-torch serves.
constexpr const char* kPython = "/usr/bin/python3";
const std::string kExamples = std::string(CORRAL_SOURCE_DIR) + "/configs/examples";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The addresses the machine's hostname resolves to, as gloo would look it up.
std::vector<std::string> hostname_addresses() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  std::vector<std::string> out;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) return out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof(text));
    out.emplace_back(text);
  }
  ::freeaddrinfo(found);
  return out;
}

class DdpGloo : public NetnsCluster {
 protected:
  void SetUp() override {
    // Only whether it is installed: a broken PyTorch should fail the test, not skip it.
    auto [rc, out] = testing::run(
        {kPython, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"});
    if (rc != 0) {
      GTEST_SKIP() << kPython << " has no torch module (exit " << rc
                   << "): install Debian's python3-torch (scripts/test.sh does)";
    }
    NetnsCluster::SetUp();
  }

  // Runs the corral CLI in the test's own namespace, as a person on their machine would.
  std::pair<int, std::string> cli(std::vector<std::string> args) {
    args.insert(args.begin(), CORRAL_CLI_BIN);
    return testing::run(args, {"CORRAL_URL=" + coord_->url(), "CORRAL_TOKEN=" + coord_->token(),
                               "CORRAL_CA=" + coord_->ca()});
  }
};

TEST_F(DdpGloo, TheExampleJobTrainsOnTwoHostsAndEveryRankEndsWithTheSameParameters) {
  std::string example = read_file(kExamples + "/ddp-gloo.yaml");
  auto spec = model::parse_job_spec(example, "ddp-gloo.yaml");
  ASSERT_TRUE(spec.has_value()) << spec.error().message();
  for (const auto& [name, value] : spec->env) EXPECT_NE(name, "GLOO_SOCKET_IFNAME") << "corral must set it";
  ASSERT_TRUE(spec->workdir.empty()) << "the test says where the script is";
  std::vector<std::string> resolved = hostname_addresses();
  bool loopback =
      std::any_of(resolved.begin(), resolved.end(), [](const auto& a) { return a.starts_with("127."); });
  std::cout << "the hostname resolves to " << (resolved.empty() ? "nothing" : resolved.front())
            << (loopback ? ": without GLOO_SOCKET_IFNAME, gloo would hand other hosts a loopback address\n"
                         : "\n");

  // The example as it is, told where its script lives.
  std::string file = dir_.file("ddp-gloo.yaml");
  std::ofstream(file) << example << "\nworkdir: " << kExamples << "\n";
  auto [submitted, out] = cli({"submit", file, "--json"});
  ASSERT_EQ(submitted, 0) << out;
  std::string id = std::to_string(parse(out)["id"].get<model::JobId>());
  auto [waited, end] = cli({"wait", id, "--timeout", "150", "--json"});
  Json j = parse(cli({"show", id, "--json"}).second);
  if (waited != 0) {
    for (int r = 0; r < 4; ++r) {
      std::cerr << "rank " << r << ":\n" << cli({"logs", id, "--rank", std::to_string(r)}).second;
    }
  }
  ASSERT_EQ(waited, 0) << end;
  EXPECT_EQ(parse(end)["state"], "COMPLETED");
  EXPECT_EQ(j["state"], "COMPLETED");
  ASSERT_EQ(j["ranks"].size(), 4u) << j.dump(2);

  std::string master = address_of(j["ranks"][0]["node"]);
  EXPECT_EQ(j["master_addr"], master);
  std::set<int> ranks;
  std::set<std::string> hosts;
  std::set<double> sums;
  std::set<int> steps;
  for (int r = 0; r < 4; ++r) {
    auto [rc, text] = cli({"logs", id, "--rank", std::to_string(r)});
    EXPECT_EQ(rc, 0) << text;
    Json line;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) {
      if (l.starts_with("{")) line = parse(l);
    }
    ASSERT_TRUE(line.is_object()) << "rank " << r << " printed no JSON line:\n" << text;
    std::string node = j["ranks"][r]["node"];
    hosts.insert(node);
    ranks.insert(line["rank"].get<int>());
    EXPECT_EQ(line["ok"], true) << line.dump();
    EXPECT_EQ(line["identical"], true) << line.dump();
    EXPECT_EQ(line["world_size"], 4);
    EXPECT_EQ(line["local_rank"], r % 2);
    EXPECT_EQ(line["master_addr"], master);
    EXPECT_EQ(line["master_port"], j["master_port"]);
    // The agent named the interface holding its advertised address, on each host its own.
    EXPECT_EQ(line["gloo_socket_ifname"], lab_->host(host_of(node)).interface) << line.dump();
    EXPECT_EQ(line["samples_per_rank"], 1003 / 4);  // DistributedSampler(drop_last=True)
    steps.insert(line["steps"].get<int>());
    sums.insert(line["parameter_sum"].get<double>());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(hosts.size(), 2u);
  EXPECT_EQ(steps, (std::set<int>{2 * (1003 / 4 / 16)}));  // two epochs of whole batches, on every rank
  EXPECT_EQ(sums.size(), 1u) << "ranks ended with different parameters";
}

// The control: the same job with gloo told to use loopback, where it goes by itself when
// the hostname resolves to 127.0.0.1. Ranks on the other host are handed that address and
// cannot connect: what corral's GLOO_SOCKET_IFNAME prevents above.
TEST_F(DdpGloo, WithGlooOnLoopbackTheSameJobCannotFormItsGroupAcrossHosts) {
  std::string spec = read_file(kExamples + "/ddp-gloo.yaml");
  auto env = spec.find("\nenv:\n");
  ASSERT_NE(env, std::string::npos);
  spec.insert(env + 6, "  GLOO_SOCKET_IFNAME: lo\n");
  auto limit = spec.find("\ntime_limit: ");
  ASSERT_NE(limit, std::string::npos);
  spec.replace(limit, spec.find('\n', limit + 1) - limit, "\ntime_limit: 30s");
  std::string file = dir_.file("ddp-gloo-lo.yaml");
  std::ofstream(file) << spec << "\nworkdir: " << kExamples << "\n";
  auto [submitted, out] = cli({"submit", file, "--json"});
  ASSERT_EQ(submitted, 0) << out;
  std::string id = std::to_string(parse(out)["id"].get<model::JobId>());
  auto [waited, end] = cli({"wait", id, "--timeout", "60", "--json"});
  EXPECT_EQ(waited, 1) << end;
  EXPECT_EQ(parse(end)["state"], "FAILED") << end;
  std::string logs;
  for (int r = 0; r < 4; ++r) logs += cli({"logs", id, "--rank", std::to_string(r)}).second;
  EXPECT_NE(logs.find("connect [127.0.0.1]"), std::string::npos) << logs;
  EXPECT_NE(logs.find("Connection refused"), std::string::npos) << logs;
}

}  // namespace
}  // namespace corral::e2e
