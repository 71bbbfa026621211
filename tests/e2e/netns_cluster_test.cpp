// A corral cluster over several hosts, each its own network namespace: rendezvous at a
// real non-loopback address, many jobs on mixed GPU classes, a foreign process on a
// master port, and what the world does to a cluster: a failing rank, a SIGKILLed agent,
// a SIGKILLed coordinator, a cut network link, cancel and time limits.

#include "tests/e2e/netns_cluster.hpp"

#include "common/core/files.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

namespace corral::e2e {
namespace {

const std::string kTcpCheck = "[" CORRAL_WORKER_BIN ", tcp-check]";

std::string job_spec(const std::string& command, const std::string& resources,
                     const std::string& extra = "") {
  return "name: e2e\ncommand: " + command + "\nresources: " + resources + "\n" + extra;
}

std::string two_by_two(const std::string& command, const std::string& extra = "") {
  return job_spec(command, "{nodes: 2, gpus_per_node: 2}", extra);
}

// Every rank also leaves a process of its own in its group: teardown must take it too.
const std::string kSleeper = "\"sleep 300 & exec sleep 300\"";

// A TCP connection from the test's own namespace, through the bridge, is accepted.
::testing::AssertionResult connects(const std::string& address, int port) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &sin.sin_addr);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "connect " << address << ":" << port << ": " << std::strerror(errno);
}

TEST(NetnsLab, RemovesEverythingItMadeAndWhatADeadLabLeft) {
  // Names of a lab whose test process died without cleaning up: a pid that is gone.
  testing::Child gone;
  ASSERT_TRUE(gone.start({"true"}));
  std::string dead = std::to_string(gone.pid());
  gone.wait();
  std::string stale_ns = testing::NetnsLab::kNamespacePrefix + dead + "-h0";
  std::string stale_link = testing::NetnsLab::kLinkPrefix + dead + "b";
  std::vector<std::string> made;
  {
    testing::NetnsLab lab(2);
    if (!lab.ok()) GTEST_SKIP() << "cannot make network namespaces here: " << lab.error();
  }
  ASSERT_EQ(testing::run({"ip", "netns", "add", stale_ns}).first, 0);
  ASSERT_EQ(testing::run({"ip", "link", "add", stale_link, "type", "bridge"}).first, 0);
  {
    testing::NetnsLab lab(2);
    ASSERT_TRUE(lab.ok()) << lab.error();
    auto namespaces = testing::NetnsLab::namespaces();
    auto links = testing::NetnsLab::links();
    EXPECT_EQ(std::count(namespaces.begin(), namespaces.end(), stale_ns), 0);
    EXPECT_EQ(std::count(links.begin(), links.end(), stale_link), 0);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(std::count(namespaces.begin(), namespaces.end(), lab.host(i).ns), 1);
      EXPECT_EQ(std::count(links.begin(), links.end(), lab.host(i).link), 1);
      made.push_back(lab.host(i).ns);
      made.push_back(lab.host(i).link);
    }
    made.push_back(lab.bridge());
    // Host 1 reaches host 0 over the bridge, and so does the test itself.
    UniqueFd listener = lab.listen_on(0, 4242);
    ASSERT_TRUE(listener);
    auto [rc, out] = testing::run({"ip", "netns", "exec", lab.host(1).ns, "bash", "-c",
                                   "exec 3<>/dev/tcp/" + lab.host(0).address + "/4242 && echo connected"});
    EXPECT_EQ(out, "connected\n");
    EXPECT_TRUE(connects(lab.host(0).address, 4242));
  }
  auto namespaces = testing::NetnsLab::namespaces();
  auto links = testing::NetnsLab::links();
  for (const auto& name : made) {
    EXPECT_EQ(
        std::count(namespaces.begin(), namespaces.end(), name) + std::count(links.begin(), links.end(), name),
        0)
        << name << " is still there";
  }
}

TEST_F(NetnsCluster, ATwoNodeTcpCheckRendezvousesAtRankZerosNamespaceAddress) {
  for (int i = 1; i <= kAgents; ++i) EXPECT_EQ(node(node_name(i))["address"], lab_->host(i).address);
  model::JobId id = submit(two_by_two(kTcpCheck));
  Json j = wait_end(id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  ASSERT_EQ(j["ranks"].size(), 4u);
  std::string master = address_of(j["ranks"][0]["node"]);
  EXPECT_NE(master, "127.0.0.1");
  EXPECT_EQ(j["master_addr"], master);
  std::set<int> ranks;
  std::set<std::string> hosts;
  for (int r = 0; r < 4; ++r) {
    Json line = rank_line(id, r);
    EXPECT_EQ(line["ok"], true) << line.dump();
    EXPECT_EQ(line["world_size"], 4);
    EXPECT_EQ(line["master_addr"], master);
    EXPECT_EQ(line["master_port"], j["master_port"]);
    EXPECT_EQ(line["sum"], 1 + 2 + 3 + 4);  // each rank adds RANK + 1: all four met at the master
    ranks.insert(line["rank"].get<int>());
    hosts.insert(j["ranks"][r]["node"].get<std::string>());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(hosts.size(), 2u);
}

// Three nodes whose GPU groups differ from one another in one thing each: the product
// (node1), the memory (node2) or the driver (node3's A100s and H100s against node1's).
class MixedClasses : public NetnsCluster {
 protected:
  std::vector<std::string> inventories() const override {
    return {
        "driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus:\n"
        "  - {name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}\n"
        "  - {name: \"NVIDIA H100 80GB HBM3\", memory_mb: 81920, count: 2, nvlink: true}\n",
        "driver: \"550.54.15\"\ncuda: \"12.4\"\ngpus:\n"
        "  - {name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}\n"
        "  - {name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 40960, count: 2, nvlink: true}\n",
        "driver: \"535.104.05\"\ncuda: \"12.2\"\ngpus:\n"
        "  - {name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}\n"
        "  - {name: \"NVIDIA H100 80GB HBM3\", memory_mb: 81920, count: 2, nvlink: true}\n",
    };
  }
};

TEST_F(MixedClasses, ManyJobsAtOnceNeverMixClassesNorShareAGpuOrPortAndAllComplete) {
  // No node has four GPUs of one class: a job that needs four on one node could only mix.
  auto four = call("POST", "/v1/jobs",
                   Json{{"spec", job_spec(kTcpCheck, "{gpus_per_node: 4}")}, {"file", "job.yaml"}}.dump());
  EXPECT_EQ(four.status, 422) << four.body;

  // Each rank writes when it began and when its processes were done, so that what a GPU
  // served can be checked rank by rank: a job's GPUs on one node are free once that
  // node's ranks are confirmed dead, while the job may still wait for another node.
  const std::string spans = dir_.file("spans");
  const std::string script = dir_.file("rank.sh");
  std::ofstream(script) << "echo \"$CORRAL_JOB_ID $RANK begin $(date +%s%N)\" >> " << spans << "\n"
                        << "sleep 0.3\n" CORRAL_WORKER_BIN " tcp-check\nrc=$?\n"
                        << "echo \"$CORRAL_JOB_ID $RANK end $(date +%s%N)\" >> " << spans << "\nexit $rc\n";
  const std::string command = "[/bin/sh, " + script + "]";
  std::vector<model::JobId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(submit(job_spec(command, "{nodes: 2, gpus_per_node: 2}")));
    ids.push_back(submit(job_spec(command, "{nodes: 2, gpus_per_node: 1}")));
    ids.push_back(submit(job_spec(command, "{gpus_per_node: 2}")));
    ids.push_back(submit(job_spec(command, "{gpus: 2}")));
    ids.push_back(submit(job_spec(command, "{gpus_per_node: 1}")));
  }
  std::vector<Json> done;
  for (model::JobId id : ids) {
    done.push_back(wait_end(id, 60));
    EXPECT_EQ(done.back()["state"], "COMPLETED") << done.back().dump(2);
  }

  // Each GPU's class as the agents reported it: (product, memory, driver).
  std::map<std::string, std::string> class_of;
  std::map<std::string, std::string> node_of;
  for (const auto& n : nodes()) {
    for (const auto& g : n["gpus"]) {
      class_of[g["uuid"]] = g["name"].get<std::string>() + "/" + std::to_string(g["memory_mib"].get<int>()) +
                            "/" + g["driver"].get<std::string>();
      node_of[g["uuid"]] = n["name"];
    }
  }
  ASSERT_EQ(class_of.size(), 12u);
  std::vector<std::set<std::string>> gpus(done.size());
  for (std::size_t k = 0; k < done.size(); ++k) {
    const Json& j = done[k];
    std::set<std::string> classes;
    for (const auto& r : j["ranks"]) {
      for (const auto& uuid : r["gpu_uuids"]) {
        ASSERT_TRUE(class_of.contains(uuid)) << uuid;
        EXPECT_EQ(node_of[uuid], r["node"]) << "job " << j["id"] << " rank " << r["rank"];
        classes.insert(class_of[uuid]);
        gpus[k].insert(uuid);
      }
    }
    EXPECT_EQ(classes.size(), 1u) << "job " << j["id"] << " mixes GPU classes: " << j.dump();
    EXPECT_EQ(gpus[k].size(), j["gpus"].get<std::size_t>()) << j.dump();
    EXPECT_EQ(j["master_addr"], address_of(j["ranks"][0]["node"]));
  }
  // Ranks that ran at the same time held different GPUs.
  std::map<std::pair<long long, int>, std::pair<long long, long long>> span;  // (job, rank) -> [begin, end] ns
  std::ifstream in(spans);
  long long job = 0;
  int rank = 0;
  std::string what;
  long long at = 0;
  while (in >> job >> rank >> what >> at) (what == "begin" ? span[{job, rank}].first : span[{job, rank}].second) = at;
  struct Held {
    long long job;
    int rank;
    long long begin;
    long long end;
  };
  std::map<std::string, std::vector<Held>> held;  // GPU uuid -> the ranks that held it
  for (const auto& j : done) {
    for (const auto& r : j["ranks"]) {
      auto s = span.at({j["id"].get<long long>(), r["rank"].get<int>()});
      ASSERT_GT(s.second, 0) << "job " << j["id"] << " rank " << r["rank"] << " wrote no end";
      for (const auto& uuid : r["gpu_uuids"]) held[uuid].push_back({j["id"], r["rank"], s.first, s.second});
    }
  }
  int overlapping = 0;
  for (const auto& [uuid, ranks] : held) {
    for (std::size_t a = 0; a < ranks.size(); ++a) {
      for (std::size_t b = a + 1; b < ranks.size(); ++b) {
        EXPECT_FALSE(ranks[a].begin < ranks[b].end && ranks[b].begin < ranks[a].end)
            << "job " << ranks[a].job << " rank " << ranks[a].rank << " and job " << ranks[b].job << " rank "
            << ranks[b].rank << " both held " << uuid << " at once";
      }
    }
  }
  // Jobs that ran at the same time held different master ports (a port is held until
  // the whole attempt is gone, so the jobs' own times tell). Times are RFC 3339 with
  // milliseconds, so they compare as strings.
  for (std::size_t a = 0; a < done.size(); ++a) {
    for (std::size_t b = a + 1; b < done.size(); ++b) {
      const Json& x = done[a];
      const Json& y = done[b];
      if (!(x["started_at"] < y["ended_at"] && y["started_at"] < x["ended_at"])) continue;
      ++overlapping;
      EXPECT_FALSE(x["master_addr"] == y["master_addr"] && x["master_port"] == y["master_port"])
          << "jobs " << x["id"] << " and " << y["id"] << " both held " << x["master_addr"] << ":"
          << x["master_port"];
    }
  }
  EXPECT_GT(overlapping, 0) << "no two jobs ran at once: nothing was checked";
  EXPECT_TRUE(parse(call("GET", "/v1/jobs").body).empty());
}

TEST_F(NetnsCluster, JobsStartOnOtherPortsWhileAForeignProcessHoldsTheFirst) {
  constexpr int kFirstPort = 29500;  // the first of the agents' range
  std::vector<UniqueFd> foreign;
  for (int i = 1; i <= kAgents; ++i) {
    foreign.push_back(lab_->listen_on(i, kFirstPort));
    ASSERT_TRUE(foreign.back()) << "cannot listen on " << lab_->host(i).address << ":" << kFirstPort;
  }
  std::vector<model::JobId> ids = {
      submit(two_by_two(kTcpCheck)), submit(job_spec(kTcpCheck, "{gpus_per_node: 2}")),
      submit(two_by_two(kTcpCheck)), submit(job_spec(kTcpCheck, "{gpus_per_node: 2}"))};
  bool told = false;
  for (model::JobId id : ids) {
    Json j = wait_end(id);
    EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
    EXPECT_NE(j["master_port"], kFirstPort);
    EXPECT_GE(j["master_port"].get<int>(), kFirstPort);
    Json events = job(id)["events"];
    for (const auto& e : events) {
      told = told || e["text"].get<std::string>().find("in use outside") != std::string::npos;
    }
  }
  EXPECT_TRUE(told) << "no job's events say the port was found busy";
  // The foreign listener still holds its port: corral never took it over.
  for (int i = 1; i <= kAgents; ++i) EXPECT_TRUE(connects(lab_->host(i).address, kFirstPort));
}

TEST_F(NetnsCluster, AFailingRankFailsTheJobNamingItAndLeavesNoProcessOnAnyHost) {
  std::string go = dir_.file("go");
  model::JobId id = submit(two_by_two("\"sleep 300 & if [ $RANK = 3 ]; then while [ ! -e " + go +
                                      " ]; do sleep 0.05; done; exit 7; fi; exec sleep 300\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json before = job(id);
  std::vector<int> ranks = pids(before);
  ASSERT_EQ(ranks.size(), 4u);
  // Each rank and its background sleep (RUNNING says the ranks started, not that each
  // shell has forked its sleep yet).
  EXPECT_TRUE(eventually([&] { return job_processes(id).size() >= 8u; }, 5s)) << job_processes(id).size();
  std::ofstream(go) << "go\n";
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "FAILED");
  EXPECT_EQ(j["failed_rank"], 3);
  EXPECT_EQ(j["failed_node"], before["ranks"][3]["node"]);
  EXPECT_EQ(j["exit_code"], 7);
  EXPECT_EQ(left_running(id, ranks), "");
}

// launch.hang_timeout: a tcp-check job whose rank 3 is stopped (SIGSTOP) before it
// connects; the other ranks compute for a few seconds, then wait for it in the
// rendezvous. Once every rank has used no CPU for the timeout, the job gets an event
// naming rank 3 as the one that stopped first, and `corral stack` (the CLI, as a person
// runs it) shows rank 3 stopped and rank 0's native stack from gdb.
TEST_F(NetnsCluster, AStoppedRankIsNamedWhenTheJobHangsAndCorralStackShowsWhereEachRankIs) {
  const std::string command =
      "[/bin/bash, -c, 'if [ \"$RANK\" = 3 ]; then kill -STOP $$; else end=$((SECONDS + 4)); "
      "while [ $SECONDS -lt $end ]; do :; done; fi; exec " CORRAL_WORKER_BIN " tcp-check --timeout 120']";
  model::JobId id = submit(two_by_two(command, "launch: {hang_timeout: 3s}\n"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json j;
  std::string hang;
  ASSERT_TRUE(eventually([&] { return !(hang = hang_event(id, j)).empty(); }, 30s))
      << j.dump(2);
  std::string node3 = j["ranks"][3]["node"];
  std::cout << hang << "\n";
  EXPECT_NE(hang.find("stopped first: rank 3 on " + node3 + " (T (stopped), since "), std::string::npos) << hang;
  EXPECT_NE(hang.find("; then rank "), std::string::npos) << hang;
  EXPECT_EQ(j["state"], "RUNNING");
  ASSERT_EQ(j["ranks"][3]["warnings"].size(), 1u) << j["ranks"][3].dump();

  auto [shown, text] = cli({"show", std::to_string(id)});
  EXPECT_NE(text.find("Warnings:\n  rank 3 on " + node3 + ": stopped first in the hang found at "), std::string::npos)
      << text;
  auto [rc3, stack3] = cli({"stack", std::to_string(id), "--rank", "3"});
  EXPECT_EQ(rc3, 0) << stack3;
  EXPECT_TRUE(stack3.starts_with("==== rank 3 on " + node3 + " ====\n")) << stack3;
  EXPECT_NE(stack3.find("(bash) T (stopped)"), std::string::npos) << stack3;
  EXPECT_EQ(stack3.find("==== rank 0"), std::string::npos) << "only the rank asked for";
  auto [rc, all] = cli({"stack", std::to_string(id)});
  EXPECT_EQ(rc, 0) << all;
  for (int r = 0; r < 4; ++r) EXPECT_NE(all.find("==== rank " + std::to_string(r) + " on "), std::string::npos) << all;
  // Rank 0 waits in the rendezvous: gdb shows its threads' frames.
  auto rank0 = all.substr(all.find("==== rank 0"), all.find("==== rank 1") - all.find("==== rank 0"));
  EXPECT_NE(rank0.find("(corral-worker) S (sleeping)"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("native stacks (gdb):"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("#0 "), std::string::npos) << rank0;
  std::cout << rank0;
  EXPECT_NE(cli({"stack", std::to_string(id), "--rank", "9"}).first, 0);
  auto no_rank = call("GET", "/v1/jobs/" + std::to_string(id) + "/stack?rank=9");
  EXPECT_EQ(no_rank.status, 404);
  EXPECT_NE(no_rank.body.find("job " + std::to_string(id) + " has no rank 9"), std::string::npos) << no_rank.body;
  EXPECT_EQ(call("GET", "/v1/jobs/" + std::to_string(id) + "/stack?rank=x").status, 400);
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(id)["state"], "CANCELLED");
}

// Simulated nodes whose inventories carry a compute-processes file (what nvidia-smi
// --query-compute-apps prints) and a utilization file (--query-gpu=index,utilization.gpu),
// written by the test as a job's ranks would use the GPUs.
// How often a file in a directory was opened (inotify) since construction.
class Opens {
 public:
  Opens(const std::string& dir, std::string name) : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)), name_(std::move(name)) {
    ok_ = fd_ >= 0 && ::inotify_add_watch(fd_, dir.c_str(), IN_OPEN) >= 0;
  }
  ~Opens() {
    if (fd_ >= 0) ::close(fd_);
  }
  Opens(const Opens&) = delete;
  Opens& operator=(const Opens&) = delete;
  bool ok() const { return ok_; }

  int count() {
    alignas(inotify_event) char buf[4096];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) > 0;) {
      for (char* p = buf; p < buf + n;) {
        auto* e = reinterpret_cast<inotify_event*>(p);
        if (e->len > 0 && name_ == e->name) ++count_;
        p += sizeof(inotify_event) + e->len;
      }
    }
    return count_;
  }

 private:
  int fd_;
  std::string name_;
  bool ok_ = false;
  int count_ = 0;
};

class GpuUse : public NetnsCluster {
 protected:
  std::vector<std::string> inventories() const override {
    std::vector<std::string> out;
    for (int i = 1; i <= kAgents; ++i) {
      out.push_back(
          "driver: \"550.54.15\"\ncuda: \"12.4\"\ncompute_apps: apps-" + std::to_string(i) +
          ".csv\nutilization: busy-" + std::to_string(i) +
          ".csv\ngpus: [{name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}]\n");
    }
    return out;
  }

  // Whole at once, as the agents may read it at any moment.
  void set_utilization(int percent) {
    for (int i = 1; i <= kAgents; ++i) {
      const std::string file = dir_.file("busy-" + std::to_string(i) + ".csv");
      const std::string pct = std::to_string(percent);
      auto written = write_file_atomically(file, "0, " + pct + "\n1, " + pct + "\n", 0644);
      ASSERT_TRUE(written.has_value()) << written.error().message();
    }
  }
};

// Rank 1's process holds memory on rank 0's GPU, as when a DDP script never calls
// torch.cuda.set_device(LOCAL_RANK): the job gets an event and `corral show` a warning
// saying exactly that; the job goes on.
TEST_F(GpuUse, ARankOnAnotherRanksGpuGetsAWarningNamingTheMissingSetDevice) {
  model::JobId id = submit(two_by_two("[sleep, \"300\"]"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json j = job(id);
  std::string node = j["ranks"][0]["node"];
  ASSERT_EQ(j["ranks"][1]["node"], node);
  std::string gpu0 = j["ranks"][0]["gpu_uuids"][0];
  int gpu0_index = j["ranks"][0]["gpus"][0];
  int pid0 = j["ranks"][0]["pid"];
  int pid1 = j["ranks"][1]["pid"];
  int gpu1_index = j["ranks"][1]["gpus"][0];
  std::ofstream(dir_.file("apps-" + std::to_string(host_of(node)) + ".csv"))
      << pid0 << ", " << gpu0 << ", 60000\n" << pid1 << ", " << gpu0 << ", 514\n";
  std::string expected = "rank 1 on " + node + ": pid " + std::to_string(pid1) + " (sleep) holds memory on GPU " +
                         std::to_string(gpu0_index) + " (" + gpu0 + "), which is not its own (its GPU: " +
                         std::to_string(gpu1_index) + "); ranks 0 and 1 all use GPU " + std::to_string(gpu0_index) +
                         ": does the program call torch.cuda.set_device(LOCAL_RANK)?";
  // The agents look every 5 s.
  ASSERT_TRUE(eventually(
      [&] {
        j = job(id);
        for (const auto& e : j["events"]) {
          if (e["text"] == expected) return true;
        }
        return false;
      },
      20s))
      << j["events"].dump(2);
  EXPECT_EQ(j["ranks"][1]["warnings"].size(), 1u) << j["ranks"][1].dump();
  EXPECT_TRUE(j["ranks"][0]["warnings"].empty()) << "GPU 0 is rank 0's own";
  auto [rc, text] = cli({"show", std::to_string(id)});
  EXPECT_NE(text.find("Warnings:\n  " + expected.substr(0, expected.find(": pid")) + ": pid " + std::to_string(pid1)),
            std::string::npos)
      << text;
  EXPECT_EQ(j["state"], "RUNNING");
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(id)["state"], "CANCELLED");
}

// On real GPUs a rank that waits on its kernels uses no CPU: a busy GPU is progress. Here
// every rank stops itself at once (no CPU at all) while its node's GPUs read busy: no hang
// is found for three times the timeout. Once the GPUs go idle it is, and it dates each
// rank's stop from then, not from when its CPU stopped.
TEST_F(GpuUse, ABusyGpuIsProgressAndAHangCountsFromWhenTheGpusWentIdle) {
  set_utilization(100);
  model::JobId id = submit(two_by_two("[/bin/bash, -c, 'kill -STOP $$']", "launch: {hang_timeout: 2s}\n"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Opens reads(dir_.path().string(), "busy-1.csv");
  ASSERT_TRUE(reads.ok());
  Json j;
  std::string hang;
  auto hang_found = [&] { return !(hang = hang_event(id, j)).empty(); };
  EXPECT_FALSE(eventually(hang_found, 6s)) << hang;
  // Samples come every second; a reading of the GPUs serves them for 5 s, so a node whose
  // ranks idle on the CPU asks nvidia-smi (here: reads its file) once in 5 s, not 5 times.
  const int opened = reads.count();
  EXPECT_GE(opened, 1);
  EXPECT_LE(opened, 2);
  const auto idle_at = std::chrono::system_clock::now();
  set_utilization(0);
  ASSERT_TRUE(eventually(hang_found, 15s)) << j.dump(2);
  std::cout << hang << "\n";
  EXPECT_TRUE(hang.starts_with("hang: no rank has used CPU or its GPUs for 2s")) << hang;
  // Every rank is named with when it stopped: no earlier than the last look that saw its
  // GPUs busy, at most a second before they went idle.
  int named = 0;
  for (std::size_t at = hang.find("since "); at != std::string::npos; at = hang.find("since ", at + 1)) {
    auto since = parse_rfc3339(hang.substr(at + 6, 24));
    ASSERT_TRUE(since.has_value()) << hang.substr(at);
    EXPECT_GT(std::chrono::system_clock::time_point(*since), idle_at - 1500ms) << hang;
    ++named;
  }
  EXPECT_EQ(named, 4) << hang;
  EXPECT_EQ(j["state"], "RUNNING");
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(id)["state"], "CANCELLED");
}

// A driver that does not answer: every node's compute-apps "output" is a FIFO nobody
// writes, so each agent's GPU-misuse check (every 5 s) blocks in it. The hang detector's
// samples must go on meanwhile: the hang, found only after that check has started,
// still gets its event. Then the FIFOs are answered (empty): the agents ask again once the
// ranks are dead, whether anything still holds the job's GPUs, and the job ends.
TEST_F(GpuUse, ADriverThatDoesNotAnswerHoldsUpNoProgressSample) {
  std::vector<std::string> fifos;
  for (int i = 1; i <= kAgents; ++i) {
    const std::string file = dir_.file("apps-" + std::to_string(i) + ".csv");
    std::filesystem::remove(file);
    ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0) << file << ": " << std::strerror(errno);
    fifos.push_back(file);
  }
  struct Answer {
    std::vector<std::string>& fifos;
    void now() {
      // Opened for reading and writing, a FIFO lets a reader blocked in open() through;
      // the file put in its place makes later reads plain, and closing gives the EOF.
      for (const auto& f : fifos) {
        int fd = ::open(f.c_str(), O_RDWR | O_NONBLOCK);
        (void)write_file_atomically(f, "", 0644);
        if (fd >= 0) ::close(fd);
      }
      fifos.clear();
    }
    ~Answer() { now(); }
  } answer{fifos};
  set_utilization(0);
  // The 8 s timeout: each agent's check (every 5 s) is blocked before any hang is due.
  model::JobId id = submit(two_by_two("[/bin/bash, -c, 'kill -STOP $$']", "launch: {hang_timeout: 8s}\n"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json j;
  std::string hang;
  ASSERT_TRUE(eventually([&] { return !(hang = hang_event(id, j)).empty(); }, 20s))
      << j.dump(2);
  EXPECT_TRUE(hang.starts_with("hang: no rank has used CPU or its GPUs for 8s")) << hang;
  answer.now();
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(id)["state"], "CANCELLED");
}

TEST_F(NetnsCluster, ASigkilledAgentsNodeGoesDownAndItsJobEndsNodeFailWithinTheTimeout) {
  model::JobId id = submit(two_by_two(kSleeper));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json before = job(id);
  std::string lost = before["ranks"][2]["node"];
  std::string kept = before["ranks"][0]["node"];
  auto killed_at = std::chrono::system_clock::now();
  agent(lost).kill9();
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "NODE_FAIL") << j.dump(2);
  auto failed_at = event_time(j, "RUNNING -> ENDING (NODE_FAIL");
  ASSERT_TRUE(failed_at.has_value()) << j.dump(2);
  EXPECT_LT(*failed_at - killed_at, kNodeLostTimeout + 1s) << j.dump(2);
  Json n = node(lost);
  EXPECT_EQ(n["state"], "down");
  EXPECT_EQ(n["connected"], false);
  EXPECT_EQ(node(kept)["state"], "up");
  // The live node was told to kill its ranks; the lost node's live on, orphans of a dead
  // agent...
  EXPECT_TRUE(all_gone(pids_on(before, kept)));
  for (int pid : pids_on(before, lost)) EXPECT_TRUE(running(pid)) << pid;
  // ...until an agent starts there again and kills what its spool says the last one left.
  ASSERT_TRUE(agent(lost).start());
  EXPECT_EQ(left_running(id, pids(before)), "");
  EXPECT_TRUE(eventually([&] { return node(lost)["state"] == "up"; }, 5s));
}

TEST_F(NetnsCluster, AJobWithARetryRunsAgainOnTheNodesLeftAfterOneIsLost) {
  model::JobId id = submit(two_by_two(
      "\"if [ $CORRAL_ATTEMPT = 0 ]; then exec sleep 300; fi; exec " CORRAL_WORKER_BIN " tcp-check\"",
      "retries: 1\n"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json first = job(id);
  EXPECT_EQ(first["attempt"], 0);
  std::string lost = first["ranks"][2]["node"];
  auto killed_at = std::chrono::system_clock::now();
  agent(lost).kill9();
  Json j = wait_end(id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_EQ(j["attempt"], 1);
  // The lost attempt was given up (and the job requeued) as fast as a NODE_FAIL.
  auto requeued_at = event_time(j, "RUNNING -> ENDING (requeued");
  ASSERT_TRUE(requeued_at.has_value()) << j.dump(2);
  EXPECT_LT(*requeued_at - killed_at, kNodeLostTimeout + 1s) << j.dump(2);
  for (const auto& name : j["node_list"]) EXPECT_NE(name, lost);
  std::string master = address_of(j["ranks"][0]["node"]);
  EXPECT_EQ(j["master_addr"], master);
  for (int r = 0; r < 4; ++r) {
    Json line = rank_line(id, r);
    EXPECT_EQ(line["ok"], true) << line.dump();
    EXPECT_EQ(line["attempt"], 1);
    EXPECT_EQ(line["master_addr"], master);
  }
  // The first attempt's ranks on the node that stayed were torn down.
  EXPECT_TRUE(all_gone(pids_on(first, first["ranks"][0]["node"])));
}

TEST_F(NetnsCluster, AJobRunningWhenTheCoordinatorIsKilledCompletesAfterItsRestart) {
  std::string go = dir_.file("go");
  model::JobId id = submit(
      two_by_two("\"while [ ! -e " + go + " ]; do sleep 0.05; done; exec " CORRAL_WORKER_BIN " tcp-check\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::set<model::JobId> acknowledged = {id};
  for (int i = 0; i < 5; ++i) acknowledged.insert(submit(two_by_two(kTcpCheck)));
  coord_->kill9();
  ASSERT_TRUE(coord_->start());
  http_ = coord_->client(70s);
  for (auto& a : agents_) ASSERT_TRUE(a->rejoined());
  std::set<model::JobId> listed;
  for (const auto& j : parse(call("GET", "/v1/jobs?all=1").body)) listed.insert(j["id"].get<model::JobId>());
  EXPECT_EQ(listed, acknowledged);
  EXPECT_EQ(job(id)["state"], "RUNNING");
  std::ofstream(go) << "go\n";
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_EQ(j["attempt"], 0);
  EXPECT_EQ(rank_line(id, 3)["sum"], 1 + 2 + 3 + 4);
  for (model::JobId q : acknowledged) EXPECT_EQ(wait_end(q)["state"], "COMPLETED") << q;
}

TEST_F(NetnsCluster, ACutLinkLosesTheNodeAndWhenItReturnsTheAgentRejoinsAndKillsItsOrphans) {
  model::JobId id = submit(two_by_two(kSleeper));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Json before = job(id);
  std::string cut = before["ranks"][2]["node"];
  std::string kept = before["ranks"][0]["node"];
  auto cut_at = std::chrono::system_clock::now();
  ASSERT_TRUE(lab_->cut(host_of(cut)));
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "NODE_FAIL") << j.dump(2);
  auto failed_at = event_time(j, "RUNNING -> ENDING (NODE_FAIL");
  ASSERT_TRUE(failed_at.has_value()) << j.dump(2);
  EXPECT_LT(*failed_at - cut_at, kNodeLostTimeout + 1s) << j.dump(2);
  EXPECT_EQ(node(cut)["state"], "down") << node(cut).dump();
  EXPECT_TRUE(all_gone(pids_on(before, kept)));
  // Nobody could tell the cut-off host: its ranks still run.
  for (int pid : pids_on(before, cut)) EXPECT_TRUE(running(pid)) << pid;
  ASSERT_TRUE(lab_->restore(host_of(cut)));
  EXPECT_TRUE(eventually([&] { return node(cut)["state"] == "up"; }, 30s)) << node(cut).dump();
  EXPECT_EQ(left_running(id, pids(before)), "");
}

TEST_F(NetnsCluster, CancelAndTimeLimitEndJobsWithNothingLeftRunning) {
  model::JobId cancelled = submit(two_by_two(kSleeper));
  ASSERT_TRUE(reaches(cancelled, "RUNNING"));
  std::vector<int> ranks = pids(job(cancelled));
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(cancelled) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(cancelled)["state"], "CANCELLED");
  EXPECT_EQ(left_running(cancelled, ranks), "");

  model::JobId limited = submit(two_by_two(kSleeper, "time_limit: 1s\n"));
  ASSERT_TRUE(reaches(limited, "RUNNING"));
  ranks = pids(job(limited));
  Json j = wait_end(limited);
  EXPECT_EQ(j["state"], "TIMEOUT");
  EXPECT_EQ(left_running(limited, ranks), "");
}

}  // namespace
}  // namespace corral::e2e
