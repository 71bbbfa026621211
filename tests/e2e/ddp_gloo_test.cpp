// Real PyTorch DDP (gloo, CPU) across two hosts in network namespaces: the example job in
// configs/examples/ddp-gloo.yaml, submitted with the corral CLI as a person would, with
// nothing set by hand; and the same job with gloo on loopback, which cannot work. Needs
// Debian's python3-torch; skips with the reason without it.

#include <sstream>
#include <filesystem>
#include <map>
#include <set>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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
  // Every rank was seen checking in (rank 0 listening on the master port, the others
  // connected to it), and the rendezvous time is what `corral show` prints.
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(j["ranks"][r]["joined_at"].is_string()) << j["ranks"][r].dump();
  ASSERT_TRUE(j["rendezvous"].is_object()) << j.dump(2);
  EXPECT_EQ(j["rendezvous"]["joined"], 4);
  ASSERT_TRUE(j["rendezvous"]["complete_after_ms"].is_number()) << j["rendezvous"].dump();
  std::int64_t after = j["rendezvous"]["complete_after_ms"];
  auto [shown, text] = cli({"show", id});
  EXPECT_NE(text.find("complete after " + std::to_string(after) + " ms (all 4 ranks checked in)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("JOINED"), std::string::npos) << text;
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
  EXPECT_EQ(parse(end)["state"], "FAILED") << end;
  EXPECT_EQ(waited, parse(end)["exit_code"]) << end;  // the failing rank's own, as srun
  std::string logs;
  for (int r = 0; r < 4; ++r) logs += cli({"logs", id, "--rank", std::to_string(r)}).second;
  EXPECT_NE(logs.find("connect [127.0.0.1]"), std::string::npos) << logs;
  EXPECT_NE(logs.find("Connection refused"), std::string::npos) << logs;
}

// The failure this watch is for: a 2 x 2 DDP job whose rank 3 sleeps before it calls
// init_process_group. Ranks 0-2 wait in the rendezvous; corral ends the job at
// launch.rendezvous_timeout, naming rank 3, its node and what its process is doing.
TEST_F(DdpGloo, ARankThatNeverJoinsEndsTheJobAtTheDeadlineNamingItsNodeAndWhatItDoes) {
  std::string script = dir_.file("late_rank.py");
  std::ofstream(script) << "import os, time\n"
                           "if os.environ['RANK'] == '3':\n"
                           "    time.sleep(600)\n"
                           "import torch.distributed as dist\n"
                           "dist.init_process_group(backend='gloo', init_method='env://')\n"
                           "dist.barrier()\n";
  std::string file = dir_.file("late.yaml");
  std::ofstream(file) << "name: late\ncommand: " << kPython << " " << script
                      << "\nresources: {nodes: 2, gpus_per_node: 2}\n"
                         "launch: {mode: torch, rendezvous_timeout: 10s}\ntime_limit: 5m\n";
  auto [submitted, out] = cli({"submit", file, "--json"});
  ASSERT_EQ(submitted, 0) << out;
  std::string id = std::to_string(parse(out)["id"].get<model::JobId>());
  auto [waited, end] = cli({"wait", id, "--timeout", "60", "--json"});
  Json j = parse(cli({"show", id, "--json"}).second);
  EXPECT_EQ(j["state"], "FAILED") << j.dump(2);
  EXPECT_EQ(j["reason"], "RendezvousTimeout") << j.dump(2);
  ASSERT_EQ(j["ranks"].size(), 4u) << j.dump(2);
  std::string node3 = j["ranks"][3]["node"];
  EXPECT_TRUE(j["ranks"][3]["joined_at"].is_null());
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(j["ranks"][r]["joined_at"].is_string()) << j["ranks"][r].dump();
  // The message: rank 3, its node, alive, python sleeping.
  std::string message;
  TimePoint failed_at{};
  for (const auto& e : j["events"]) {
    std::string text = e["text"];
    if (text.find("rendezvous not complete") != std::string::npos) {
      message = text;
      failed_at = *parse_rfc3339(e["at"].get<std::string>());
    }
  }
  EXPECT_NE(message.find("3 of 4 ranks checked in; missing rank 3 on " + node3 + ": alive, pid "), std::string::npos)
      << j["events"].dump(2);
  EXPECT_NE(message.find("S (sleeping)"), std::string::npos) << message;
  // Within the timeout + 2 s of the start.
  auto started = parse_rfc3339(j["started_at"].get<std::string>());
  ASSERT_TRUE(started.has_value());
  auto took = failed_at - *started;
  auto ended = parse_rfc3339(j["ended_at"].get<std::string>());
  ASSERT_TRUE(ended.has_value());
  std::cout << "rendezvous timeout 10 s: the job's failure was recorded " << took.count()
            << " ms after its start, every rank gone and the job FAILED after " << (*ended - *started).count()
            << " ms: " << message << "\n";
  EXPECT_GE(took, std::chrono::seconds(10));
  EXPECT_LT(took, std::chrono::seconds(12));
  auto [shown, text] = cli({"show", id});
  EXPECT_NE(text.find("RendezvousTimeout"), std::string::npos) << text;
  EXPECT_NE(text.find("missing rank 3 on " + node3), std::string::npos) << text;
}

// A rank's view as rank_view.py wrote it, by rank.
std::map<int, Json> rank_views(const std::string& dir, const std::string& tag) {
  std::map<int, Json> out;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(dir + "/" + tag + "-rank-" + std::to_string(r) + ".json");
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    out[r] = Json::parse(text.str(), nullptr, false);
  }
  return out;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Debian's real torchrun, 2 nodes x 2 processes (two torchrun on loopback), beside the same
// script through corral on two hosts: every variable torchrun gives its workers is there,
// with the same value wherever the two must agree, and torch.distributed sees the same
// ranks. Also sbatch's habits: the rank starts in the directory `corral submit` ran in,
// with the submitting shell's variables, never the token.
TEST_F(DdpGloo, ARankSeesWhatTorchrunWouldGiveItAndTheSubmittingShellsEnvironment) {
  const std::string script = std::string(CORRAL_SOURCE_DIR) + "/tests/e2e/data/rank_view.py";
  const std::string out = dir_.path().string();
  // torchrun, as its users start it on two nodes (Python 3.11 needs --redirects/--tee).
  // torchrun is the peer here, not what is tested: its agent picks its workers' port by
  // binding port 0 and letting it go, which another test running beside this one can take
  // first; and a worker that connects to that other listener waits for a store that never
  // answers. A reference run that fails, or has not ended after 90 s, is shown, killed
  // with its workers (they share its process group), and tried again with a new port, twice
  // at most.
  std::string failures;
  bool reference_ran = false;
  for (int attempt = 0; attempt < 3 && !reference_ran; ++attempt) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    std::string port = std::to_string(free_port());
    std::vector<std::unique_ptr<testing::Child>> nodes;
    for (int n = 0; n < 2; ++n) {
      auto c = std::make_unique<testing::Child>();
      ASSERT_TRUE(c->start({"/usr/bin/torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank",
                            std::to_string(n), "--master_addr", "127.0.0.1", "--master_port", port,
                            "--redirects", "9:0", "--tee", "9:0", script, out, "torchrun"}));
      nodes.push_back(std::move(c));
    }
    reference_ran = true;
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      std::string said;
      std::optional<int> status = nodes[n]->wait_until(deadline, said);
      if (status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) continue;
      reference_ran = false;
      std::string failure = "attempt " + std::to_string(attempt + 1) + ", torchrun node " + std::to_string(n) +
                            " (port " + port + ") " +
                            (status ? "ended with status " + std::to_string(*status) : "had not ended after 90 s") +
                            "\nstdout:\n" + said + "stderr:\n";
      for (const auto& line : nodes[n]->lines()) failure += line + "\n";
      std::cout << failure << std::flush;  // now, not only at the end: a run that hangs shows why
      failures += failure;
    }
    for (auto& node : nodes) node->kill_and_wait(SIGKILL);
  }
  ASSERT_TRUE(reference_ran) << failures;
  // corral, from a shell in another directory with a variable of its own.
  std::string from = dir_.file("submitted-from");
  std::filesystem::create_directories(from);
  std::string file = dir_.file("rank-view.yaml");
  std::ofstream(file) << "name: rank-view\ncommand: /usr/bin/python3 " << script << " " << out << " corral\n"
                      << "resources: {nodes: 2, gpus_per_node: 2}\ntime_limit: 5m\n";
  auto [submitted, text] = testing::run(
      {"/bin/sh", "-c", "cd '" + from + "' && exec " CORRAL_CLI_BIN " submit --json " + file},
      {"CORRAL_URL=" + coord_->url(), "CORRAL_TOKEN=" + coord_->token(), "CORRAL_CA=" + coord_->ca(),
       "E2E_FROM_THE_SHELL=yes", "CORRAL_KEEP_CONNECTION=0"});
  ASSERT_EQ(submitted, 0) << text;
  std::string id = std::to_string(parse(text)["id"].get<model::JobId>());
  auto [waited, end] = cli({"wait", id, "--timeout", "120", "--json"});
  ASSERT_EQ(waited, 0) << end;

  auto torchrun = rank_views(out, "torchrun");
  auto corral = rank_views(out, "corral");
  ASSERT_EQ(torchrun.size(), 4u);
  ASSERT_EQ(corral.size(), 4u);
  // What torchrun set: what its workers have that this test's own environment has not.
  std::set<std::string> inherited;
  for (char** e = ::environ; *e != nullptr; ++e) {
    std::string kv(*e);
    inherited.insert(kv.substr(0, kv.find('=')));
  }
  // Not the same by nature: where the store is, the run's id, whose store it is, and a
  // file for torchrun's own error records (corral records each rank's end itself).
  const std::set<std::string> differ = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"};
  std::set<std::string> compared;
  for (int r = 0; r < 4; ++r) {
    const Json& t = torchrun[r];
    const Json& c = corral[r];
    EXPECT_EQ(t["rank"], r);
    EXPECT_EQ(c["rank"], r);
    EXPECT_EQ(c["world_size"], t["world_size"]);
    for (const auto& [name, value] : t["env"].items()) {
      if (inherited.contains(name)) continue;
      if (name == "TORCHELASTIC_ERROR_FILE") continue;
      ASSERT_TRUE(c["env"].contains(name)) << "torchrun sets " << name << "=" << value << "; corral does not";
      if (!differ.contains(name)) {
        EXPECT_EQ(c["env"][name], value) << name << " of rank " << r;
        compared.insert(name);
      }
    }
    EXPECT_EQ(c["env"]["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(c["env"]["CUDA_VISIBLE_DEVICES"], "0,1");  // the node's GPUs, LOCAL_RANK indexes them
    EXPECT_EQ(c["env"]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    // sbatch's habits: where it was submitted, the shell's variables, never the token.
    EXPECT_EQ(c["cwd"], from);
    EXPECT_EQ(c["env"]["E2E_FROM_THE_SHELL"], "yes");
    EXPECT_EQ(c["env"]["PATH"], std::getenv("PATH"));
    EXPECT_FALSE(c["env"].contains("CORRAL_TOKEN"));
    EXPECT_FALSE(c["env"].contains("CORRAL_URL"));
  }
  for (const char* must : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                           "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_MAX_RESTARTS"}) {
    EXPECT_TRUE(compared.contains(must)) << must << " was not compared: torchrun did not set it?";
  }
}

}  // namespace
}  // namespace corral::e2e
