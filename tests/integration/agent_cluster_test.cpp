// Real agents (simulated inventories) against the real coordinator over TLS on
// loopback: jobs run as real processes with the real corral-worker; failures, lost
// agents and a coordinator restart are real SIGKILLs.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <pwd.h>
#include <sys/resource.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/core/time.hpp"
#include "common/model/job.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/flood.hpp"

namespace corral {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testing::AgentProcess;
using testing::CoordinatorProcess;

using testing::current_user;
using testing::eventually;

using testing::running;

constexpr const char* kSettings = "";

class AgentClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(sim_) << "driver: \"550.54.15\"\ncuda: \"12.4\"\n"
                           "gpus: [{name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}]\n";
    ASSERT_TRUE(coord_.init_ok());
    ASSERT_TRUE(coord_.start());
    http_ = coord_.client(70s);
    a_ = std::make_unique<AgentProcess>(coord_, dir_, "gpu-a", sim_);
    b_ = std::make_unique<AgentProcess>(coord_, dir_, "gpu-b", sim_);
    ASSERT_TRUE(a_->start());
    ASSERT_TRUE(b_->start());
  }

  void TearDown() override {
    TearDownJobs();
    if (!mounted_.empty()) ::umount2(mounted_.c_str(), MNT_DETACH);
  }

  void TearDownJobs() {
    // Ranks live in their own process groups and outlive a stopped agent: end every job
    // still live while the agents run, so a failed test leaves no process behind.
    if (http_) {
      auto live = http_->request("GET", "/v1/jobs", "", {{"Authorization", "Bearer " + coord_.token()}});
      if (live && live->status == 200) {
        for (const auto& j : Json::parse(live->body)) {
          std::string id = std::to_string(j["id"].get<model::JobId>());
          http_->request("POST", "/v1/jobs/" + id + "/cancel", "", {{"Authorization", "Bearer " + coord_.token()}});
          http_->request("GET", "/v1/jobs/" + id + "?wait=10", "", {{"Authorization", "Bearer " + coord_.token()}});
        }
      }
    }
    if (HasFailure()) {
      for (const auto& line : coord_.process().lines()) std::cerr << "coordinator: " << line << "\n";
      for (auto* agent : {a_.get(), b_.get()}) {
        if (agent == nullptr) continue;
        for (const auto& line : agent->process().lines()) std::cerr << "agent: " << line << "\n";
      }
    }
  }

  net::HttpResponse call(const std::string& method, const std::string& target, const std::string& body = {}) {
    auto r = http_->request(method, target, body, {{"Authorization", "Bearer " + coord_.token()}});
    EXPECT_TRUE(r.has_value()) << r.error().message();
    return r ? *r : net::HttpResponse{0, "", "", {}};
  }

  model::JobId submit(const std::string& spec) {
    auto r = call("POST", "/v1/jobs", Json{{"spec", spec}, {"file", "job.yaml"}}.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    return r.status == 201 ? Json::parse(r.body)["id"].get<model::JobId>() : 0;
  }

  Json job(model::JobId id) { return Json::parse(call("GET", "/v1/jobs/" + std::to_string(id)).body); }

  // Waits for the job to end (the coordinator holds the request until it does).
  Json wait_end(model::JobId id, int seconds = 30) {
    auto r = call("GET", "/v1/jobs/" + std::to_string(id) + "?wait=" + std::to_string(seconds));
    return Json::parse(r.body);
  }

  bool reaches(model::JobId id, const std::string& state, std::chrono::milliseconds timeout = 10s) {
    return eventually([&] { return job(id)["state"] == state; }, timeout);
  }

  std::string log(model::JobId id, int rank) {
    auto r = call("GET", "/v1/jobs/" + std::to_string(id) + "/logs?rank=" + std::to_string(rank));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? Json::parse(r.body)["data"].get<std::string>() : "";
  }

  std::vector<int> pids(const Json& j) {
    std::vector<int> out;
    for (const auto& r : j["ranks"]) {
      if (r["pid"].is_number()) out.push_back(r["pid"].get<int>());
    }
    return out;
  }

  bool all_gone(const std::vector<int>& pids, std::chrono::milliseconds timeout = 5s) {
    return eventually(
        [&] { return std::none_of(pids.begin(), pids.end(), running); }, timeout);
  }

  // The coordinator started again (after a kill9) and both agents welcomed by it.
  void coordinator_back() {
    ASSERT_TRUE(coord_.start());
    http_ = coord_.client(70s);
    ASSERT_TRUE(a_->rejoined());
    ASSERT_TRUE(b_->rejoined());
  }

  std::string two_node(const std::string& command, const std::string& extra = "") {
    return "name: t\ncommand: " + command + "\nresources: {nodes: 2, gpus_per_node: 2}\n" + extra;
  }

  std::pair<model::JobId, std::string> kill_b_under_a_job_then_restart_it_with(
      const std::function<std::string(const std::string& uuid)>& apps_csv);
  Json node_b_once_drained();
  std::unique_ptr<AgentProcess> nccl_node(const std::string& root_body);
  // gpu-c with `config` added, its spool a tmpfs mounted with `spool_mount` options when
  // given (nullptr when it cannot be mounted); gpu-a and gpu-b drained.
  std::unique_ptr<AgentProcess> node_c(const std::string& config, const std::string& spool_mount = "");
  Json whole_log(model::JobId id, int rank, std::string& text);
  std::string mounted_;  // unmounted at the end

  testing::TempDir dir_;
  std::string sim_ = dir_.file("sim.yaml");
  CoordinatorProcess coord_{dir_, kSettings, current_user()};
  std::unique_ptr<net::HttpClient> http_;
  std::unique_ptr<AgentProcess> a_;
  std::unique_ptr<AgentProcess> b_;
};

TEST_F(AgentClusterTest, ATwoNodeTcpCheckCompletesAndEveryRankSawTheRightEnvironment) {
  model::JobId id = submit(two_node("[" CORRAL_WORKER_BIN ", tcp-check]"));
  Json j = wait_end(id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_EQ(j["exit_code"], 0);
  ASSERT_EQ(j["ranks"].size(), 4u);
  std::set<int> ranks;
  for (int r = 0; r < 4; ++r) {
    std::string text = log(id, r);
    auto brace = text.find('{');
    ASSERT_NE(brace, std::string::npos) << text;
    Json line = Json::parse(text.substr(brace, text.find('\n', brace) - brace));
    EXPECT_EQ(line["ok"], true) << text;
    EXPECT_EQ(line["world_size"], 4);
    EXPECT_EQ(line["master_addr"], "127.0.0.1");
    EXPECT_EQ(line["master_port"], j["master_port"]);
    EXPECT_EQ(line["node_rank"], r / 2);
    EXPECT_EQ(line["local_rank"], r % 2);
    EXPECT_EQ(line["sum"], 1 + 2 + 3 + 4);  // each rank adds RANK + 1: the all-reduce really ran
    EXPECT_EQ(line["cuda_visible_devices"], "0,1");  // the node's GPUs; LOCAL_RANK indexes them
    ranks.insert(line["rank"].get<int>());
    EXPECT_EQ(j["ranks"][r]["state"], "EXITED");
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  // Its master port, left with connections in TIME_WAIT, is free for the next job.
  Json next = wait_end(submit(two_node("[" CORRAL_WORKER_BIN ", tcp-check]")));
  EXPECT_EQ(next["state"], "COMPLETED");
  EXPECT_EQ(next["master_port"], j["master_port"]) << next.dump(2);
}

TEST_F(AgentClusterTest, TheJobsEnvironmentAndWorkdirReachEveryRank) {
  std::string spec =
      "name: env\ncommand: \"echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE N=$NODE_RANK "
      "G=$GROUP_RANK M=$MASTER_ADDR:$MASTER_PORT C=$CUDA_VISIBLE_DEVICES O=$OMP_NUM_THREADS J=$CORRAL_JOB_ID "
      "X=$EXTRA D=$(pwd)\"\nworkdir: " +
      dir_.path().string() + "\nenv: {EXTRA: hello}\nresources: {nodes: 2, gpus_per_node: 2}\n";
  model::JobId id = submit(spec);
  Json j = wait_end(id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  std::string master = "127.0.0.1:" + std::to_string(j["master_port"].get<int>());
  EXPECT_EQ(log(id, 3), "R=3 L=1 W=4 LW=2 N=1 G=1 M=" + master + " C=0,1 O=1 J=" + std::to_string(id) +
                            " X=hello D=" + dir_.path().string() + "\n");
  // launch.gpu_visibility: rank shows each rank only its own GPU.
  id = submit(two_node("\"echo C=$CUDA_VISIBLE_DEVICES\"", "launch: {gpu_visibility: rank}\n"));
  ASSERT_EQ(wait_end(id)["state"], "COMPLETED");
  EXPECT_EQ(log(id, 3), "C=1\n");
}

TEST_F(AgentClusterTest, WhatCannotStartEndsTheJobLaunchFailedNamingTheNodeUserAndPath) {
  const std::string user = current_user();
  model::JobId id = submit(two_node("[true]", "workdir: /nonexistent/corral-dir\n"));
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "FAILED") << j.dump(2);
  EXPECT_EQ(j["reason"], "LaunchFailed");
  EXPECT_FALSE(j["failed_node"].get<std::string>().empty());
  EXPECT_NE(j["detail"].get<std::string>().find("cannot start as user " + user +
                                                 ": workdir /nonexistent/corral-dir: No such file or directory"),
            std::string::npos)
      << j.dump(2);
  // Each rank's marker stayed until the coordinator had its report, and goes then.
  auto markers_left = [&] {
    std::size_t n = 0;
    for (const auto* a : {a_.get(), b_.get()}) {
      std::error_code ec;
      for (auto it = std::filesystem::directory_iterator(a->spool() + "/running", ec);
           !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
        ++n;
      }
    }
    return n;
  };
  EXPECT_TRUE(eventually([&] { return markers_left() == 0; }, 5s)) << markers_left() << " markers left";
  // A shell command whose program is nowhere on the rank's PATH: found before anything runs.
  id = submit(two_node("\"trian.py --lr 3\""));
  j = wait_end(id);
  EXPECT_EQ(j["reason"], "LaunchFailed") << j.dump(2);
  EXPECT_NE(j["detail"].get<std::string>().find("command not found: trian.py (PATH=/usr/local/bin:/usr/bin:/bin)"),
            std::string::npos)
      << j.dump(2);
  // Submitted from a directory, with an environment: the ranks start there, with it.
  auto r = call("POST", "/v1/jobs",
                Json{{"spec", two_node("\"echo $(pwd) $FROM_SHELL\"")},
                     {"submit_dir", dir_.path().string()},
                     {"environment", Json::array({Json::array({"FROM_SHELL", "yes"})})}}
                    .dump());
  ASSERT_EQ(r.status, 201) << r.body;
  id = Json::parse(r.body)["id"].get<model::JobId>();
  ASSERT_EQ(wait_end(id)["state"], "COMPLETED");
  EXPECT_EQ(log(id, 2), dir_.path().string() + " yes\n");
  // What may not travel is refused, naming it, and nothing is submitted.
  r = call("POST", "/v1/jobs",
           Json{{"spec", two_node("[true]")}, {"environment", Json::array({Json::array({"RANK", "9"})})}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("environment[0]: variable RANK cannot travel"), std::string::npos) << r.body;
}

TEST_F(AgentClusterTest, AnAgentStartedBeforeItsCaIsInPlaceJoinsOnceItIs) {
  AgentProcess c(coord_, dir_, "gpu-c", sim_);
  std::string ca = dir_.file("agents") + "/ca.pem";
  std::filesystem::rename(ca, ca + ".away");  // as if issue-agent-cert had not finished
  ASSERT_TRUE(c.start(false));
  EXPECT_TRUE(c.process().wait_for_line("cannot load CA " + ca + ": No such file or directory"));
  std::filesystem::rename(ca + ".away", ca);
  // It keeps trying with its backoff (500 ms at most here), and loads it whole.
  EXPECT_TRUE(c.process().wait_for_line("welcomed by the coordinator", std::chrono::seconds(10)));
  c.stop();
}

TEST_F(AgentClusterTest, AnAgentWhoseNvidiaSmiAndPreflightHangForAMinuteKeepsItsNodeAndItsJob) {
  // Only the node under test takes the job.
  a_->stop();
  b_->stop();
  // nvidia-smi answers from a recorded RTX 4090 workstation, and corral-worker preflight
  // passes, until `slow` exists: then each call says so in `hung` and takes a minute.
  const std::string data = CORRAL_NVIDIA_SMI_DATA "/rtx4090-workstation";
  const std::string slow = dir_.file("slow");
  const std::string hung = dir_.file("hung");
  const std::string smi = dir_.file("nvidia-smi");
  const std::string worker = dir_.file("worker");
  std::ofstream(smi) << "#!/bin/sh\n"
                     << "if [ -e " << slow << " ]; then echo \"nvidia-smi $$\" >> " << hung << "; sleep 60; fi\n"
                     << "case \"$1\" in\n"
                     << "  --query-gpu=*) cat " << data << "/query_gpu.csv ;;\n"
                     << "  --query-compute-apps=*) ;;\n"
                     << "  topo) cat " << data << "/topo_m.txt ;;\n"
                     << "  *) cat " << data << "/nvidia_smi.txt ;;\n"
                     << "esac\n";
  std::ofstream(worker) << "#!/bin/sh\n"
                        << "if [ \"$1\" = preflight ]; then\n"
                        << "  if [ -e " << slow << " ]; then echo \"preflight $$\" >> " << hung << "; sleep 60; fi\n"
                        << "  exit 0\n"
                        << "fi\n"
                        << "exec " CORRAL_WORKER_BIN " \"$@\"\n";
  for (const auto& f : {smi, worker}) std::filesystem::permissions(f, std::filesystem::perms::owner_all);
  AgentProcess n(coord_, dir_, "gpu-n", "");
  n.configure("nvidia_smi: " + smi + "\nworker: " + worker + "\npreflight_interval: 200ms");
  ASSERT_TRUE(n.start());

  model::JobId id = submit("name: t\ncommand: [sleep, '300']\nresources: {gpus: 1}\n");
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::ofstream(slow) << "1\n";
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(hung); }, 5s)) << "no preflight ran";

  // For four node timeouts while it hangs: the node stays up with its heartbeats coming,
  // the job runs, and the agent answers a log request at once.
  std::set<std::string> heartbeats;
  auto until = std::chrono::steady_clock::now() + 4 * CoordinatorProcess::kNodeTimeout;
  while (std::chrono::steady_clock::now() < until) {
    for (const auto& node : Json::parse(call("GET", "/v1/nodes").body)) {
      if (node["name"] != "gpu-n") continue;
      EXPECT_EQ(node["state"], "up") << node.dump();
      EXPECT_TRUE(node["connected"].get<bool>()) << node.dump();
      heartbeats.insert(node["last_seen"].dump());
    }
    EXPECT_EQ(job(id)["state"], "RUNNING");
    auto asked = std::chrono::steady_clock::now();
    log(id, 0);
    EXPECT_LT(std::chrono::steady_clock::now() - asked, 1s) << "the agent answered a log request late";
    std::this_thread::sleep_for(200ms);  // sampling over the period, not waiting for an event
  }
  EXPECT_GE(heartbeats.size(), 5u) << "the node's last_seen stopped advancing";
  // The checks were still hanging all along: none of it was waited for.
  std::ifstream in(hung);
  std::string what;
  pid_t pid = 0;
  std::vector<pid_t> hanging;
  while (in >> what >> pid) hanging.push_back(pid);
  ASSERT_FALSE(hanging.empty());
  EXPECT_TRUE(running(hanging.front())) << "the first hung check ended: the test proved nothing";

  std::filesystem::remove(slow);
  call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  EXPECT_EQ(wait_end(id)["state"], "CANCELLED");
  for (pid_t p : hanging) ::kill(-p, SIGKILL);  // each in its own process group
  n.stop();
}

TEST_F(AgentClusterTest, AnAgentWhoseNvidiaSmiHangsAtStartAnswersSignalsAndJoinsOnceItAnswers) {
  // nvidia-smi answers from a recorded workstation, but while `hold` exists each call
  // first waits for the test to open the `gate` FIFO.
  const std::string data = CORRAL_NVIDIA_SMI_DATA "/rtx4090-workstation";
  const std::string hold = dir_.file("hold");
  const std::string gate = dir_.file("gate");
  const std::string waiting = dir_.file("waiting");
  const std::string smi = dir_.file("nvidia-smi");
  ASSERT_EQ(::mkfifo(gate.c_str(), 0600), 0);
  std::ofstream(hold) << "1\n";
  std::ofstream(smi) << "#!/bin/sh\n"
                     << "if [ -e " << hold << " ]; then echo $$ >> " << waiting << "; cat " << gate
                     << " > /dev/null; fi\n"
                     << "case \"$1\" in\n"
                     << "  --query-gpu=*) cat " << data << "/query_gpu.csv ;;\n"
                     << "  --query-compute-apps=*) ;;\n"
                     << "  topo) cat " << data << "/topo_m.txt ;;\n"
                     << "  *) cat " << data << "/nvidia_smi.txt ;;\n"
                     << "esac\n";
  std::filesystem::permissions(smi, std::filesystem::perms::owner_all);
  // Lets every nvidia-smi waiting at the gate through (a writer's open meets each reader).
  auto open_gate = [&] {
    int fd = ::open(gate.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    return fd >= 0;
  };
  auto node_listed = [&] {
    for (const auto& node : Json::parse(call("GET", "/v1/nodes").body)) {
      if (node["name"] == "gpu-n") return true;
    }
    return false;
  };

  // While nvidia-smi hangs the agent's loop runs: SIGTERM stops it at once, cleanly.
  {
    AgentProcess n(coord_, dir_, "gpu-n", "");
    n.configure("nvidia_smi: " + smi);
    ASSERT_TRUE(n.start(false));
    ASSERT_TRUE(n.process().wait_for_line("surveying the node", 10s));
    ASSERT_TRUE(eventually([&] { return std::filesystem::exists(waiting); }, 10s)) << "nvidia-smi never ran";
    EXPECT_FALSE(node_listed()) << "the node joined before its GPUs were known";
    auto asked = std::chrono::steady_clock::now();
    ::kill(n.process().pid(), SIGTERM);
    int status = n.process().wait();
    EXPECT_LT(std::chrono::steady_clock::now() - asked, 2s * testing::kSanitizerSlowdown);
    ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << [&] {
      std::string all;
      for (const auto& line : n.process().lines()) all += line + "\n";
      return all;
    }();
    EXPECT_TRUE(open_gate()) << "the hung nvidia-smi was not waiting any more: the test proved nothing";
  }

  // Started again: it joins once nvidia-smi answers, with the GPUs it lists.
  AgentProcess n(coord_, dir_, "gpu-n", "");
  n.configure("nvidia_smi: " + smi);
  ASSERT_TRUE(n.start(false));
  ASSERT_TRUE(n.process().wait_for_line("surveying the node", 10s));
  EXPECT_FALSE(node_listed());
  std::filesystem::remove(hold);
  // One that saw `hold` before it went may still be on its way to the gate.
  auto welcomed = [&] {
    for (const auto& line : n.process().lines()) {
      if (line.find("welcomed by the coordinator") != std::string::npos) return true;
    }
    return false;
  };
  ASSERT_TRUE(eventually([&] { return (open_gate(), welcomed()); }, 20s));
  for (const auto& node : Json::parse(call("GET", "/v1/nodes").body)) {
    if (node["name"] != "gpu-n") continue;
    EXPECT_EQ(node["gpus"].size(), 1u) << node.dump();
    EXPECT_EQ(node["driver"], "550.54.15") << node.dump();
    EXPECT_FALSE(node["simulated"].get<bool>()) << node.dump();
  }
  EXPECT_TRUE(node_listed());
  n.stop();
}

// The resident memory of a process, in KiB.
long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("VmRSS:")) return std::stol(line.substr(6));
  }
  return -1;
}

TEST_F(AgentClusterTest, AFloodOfSilentAndHalfOpenConnectionsLocksOutNoClientAndNoAgent) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_max < 3000) GTEST_SKIP() << "the open file limit (" << files.rlim_max << ") is below the flood's 2,200";
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  const pid_t coordinator = coord_.process().pid();
  const long rss_before = rss_kib(coordinator);

  // 2,000 silent TCP connections from 40 addresses and 200 stopped in their TLS handshake
  // from 4 more, each opened again (up to 1,000 a second) when the server closes it.
  std::vector<std::string> idle_from;
  std::vector<std::string> tls_from;
  for (int i = 2; i < 42; ++i) idle_from.push_back("127.0.0." + std::to_string(i));
  for (int i = 42; i < 46; ++i) tls_from.push_back("127.0.0." + std::to_string(i));
  testing::Flood idle({coord_.port(), idle_from, 2000, 0});
  testing::Flood tls({coord_.port(), tls_from, 0, 200});
  ASSERT_EQ(idle.failed() + tls.failed(), 0);
  // The server keeps no more of them than its budget (512): it closed the rest for newer ones.
  ASSERT_TRUE(eventually([&] { return idle.closed_by_server() + tls.closed_by_server() >= 2200 - 512; }, 10s))
      << "the server holds " << 2200 - idle.closed_by_server() - tls.closed_by_server() << " of them";

  // A person's `corral queue`, while the flood goes on.
  const std::vector<std::string> env = {"CORRAL_URL=" + coord_.url(), "CORRAL_TOKEN=" + coord_.token(),
                                        "CORRAL_CA=" + coord_.ca(), "CORRAL_KEEP_CONNECTION=0"};
  std::chrono::milliseconds worst{0};
  for (int i = 0; i < 5; ++i) {
    auto asked = std::chrono::steady_clock::now();
    auto [rc, out] = testing::run({CORRAL_CLI_BIN, "queue"}, env);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - asked);
    EXPECT_EQ(rc, 0) << out;
    worst = std::max(worst, took);
  }
  EXPECT_LT(worst, 1s * testing::kSanitizerSlowdown);

  // An agent killed and started again gets back in.
  a_->kill9();
  auto restarted = std::chrono::steady_clock::now();
  ASSERT_TRUE(a_->start());
  auto rejoin = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - restarted);
  EXPECT_LT(rejoin, 2s * testing::kSanitizerSlowdown);

  const long rss_during = rss_kib(coordinator);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (Under a sanitizer its shadow memory and quarantine say nothing about corral's.)
  EXPECT_LT(rss_during - rss_before, 64 * 1024) << "the coordinator grew from " << rss_before << " to " << rss_during
                                                 << " KiB";
#endif
  std::cout << "flood: " << idle.opened() + tls.opened() << " connections opened, "
            << idle.closed_by_server() + tls.closed_by_server() << " closed by the coordinator; corral queue "
            << worst.count() << " ms at worst; agent rejoined in " << rejoin.count() << " ms; coordinator RSS "
            << rss_before << " -> " << rss_during << " KiB\n";
}

TEST_F(AgentClusterTest, ARankWhosePidNeverReachedItsMarkerIsKilledByTheNextAgent) {
  // As an agent SIGKILLed between writing a rank's marker (pid 0: about to start) and its
  // pid leaves things: the rank runs, its marker names no pid.
  AgentProcess c(coord_, dir_, "gpu-c", sim_);
  const std::string id = "0123456789abcdef0123456789abcdef";
  std::filesystem::create_directories(c.spool() + "/running");
  std::ofstream(c.spool() + "/agent-id") << id << "\n";
  std::ofstream(c.spool() + "/running/7-0-0") << "0 -\n";
  testing::Child rank;
  ASSERT_TRUE(rank.start({"/bin/sleep", "300"}, {"CORRAL_JOB_ID=7", "CORRAL_ATTEMPT=0", "CORRAL_AGENT_ID=" + id}));
  ASSERT_TRUE(eventually([&] { return running(rank.pid()); }, 5s));
  ASSERT_TRUE(c.start());
  EXPECT_TRUE(eventually([&] { return !running(rank.pid()); }, 5s)) << "the rank left behind still runs";
  c.stop();
}

TEST_F(AgentClusterTest, AFailingRankTakesTheGangDownWithNoProcessLeft) {
  std::string go = dir_.file("go");
  model::JobId id = submit(two_node("\"if [ $RANK = 3 ]; then while [ ! -e " + go +
                                    " ]; do sleep 0.05; done; exit 7; fi; exec sleep 300\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::vector<int> running = pids(job(id));
  ASSERT_EQ(running.size(), 4u);
  std::ofstream(go) << "go\n";
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "FAILED");
  EXPECT_EQ(j["failed_rank"], 3);
  EXPECT_EQ(j["failed_node"], "gpu-b");
  EXPECT_EQ(j["exit_code"], 7);
  EXPECT_TRUE(all_gone(running)) << "a rank of the failed job is still running";
  // Each killed rank's end is reported too.
  EXPECT_TRUE(eventually(
      [&] {
        Json now = job(id);
        return std::all_of(now["ranks"].begin(), now["ranks"].end(),
                           [](const Json& r) { return r["state"] == "EXITED" || r["state"] == "KILLED"; });
      },
      5s));
}

TEST_F(AgentClusterTest, ASigkilledAgentMakesItsNodeDownAndTheJobNodeFail) {
  model::JobId id = submit(two_node("[sleep, '300']"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::vector<int> running = pids(job(id));
  ASSERT_EQ(running.size(), 4u);
  auto killed_at = std::chrono::steady_clock::now();
  b_->kill9();
  Json j = wait_end(id);
  auto took = std::chrono::steady_clock::now() - killed_at;
  EXPECT_EQ(j["state"], "NODE_FAIL") << j.dump(2);
  EXPECT_LT(took, CoordinatorProcess::kNodeLostTimeout + 1s) << "node_lost_timeout plus a second";
  Json nodes = Json::parse(call("GET", "/v1/nodes").body);
  EXPECT_EQ(nodes[1]["state"], "down");
  // gpu-a was told to kill its ranks and confirmed; gpu-b's are orphans of the dead agent,
  // not confirmed dead: their GPUs stay fenced...
  EXPECT_TRUE(all_gone({running[0], running[1]}));
  EXPECT_TRUE(testing::running(running[2]));
  ASSERT_EQ(j["fences"].size(), 1u) << j.dump(2);
  EXPECT_EQ(j["fences"][0]["node"], "gpu-b");
  EXPECT_EQ(nodes[1]["gpus"][0]["job"], id) << nodes[1].dump();
  // ...until an agent starts again there, kills what its spool says the last one left,
  // and confirms.
  ASSERT_TRUE(b_->start());
  EXPECT_TRUE(all_gone({running[2], running[3]}));
  EXPECT_TRUE(eventually([&] { return job(id)["fences"].empty(); }, 5s)) << job(id).dump(2);
  EXPECT_TRUE(eventually([&] { return Json::parse(call("GET", "/v1/nodes").body)[1]["state"] == "up"; }, 5s));
  EXPECT_TRUE(Json::parse(call("GET", "/v1/nodes").body)[1]["gpus"][0]["job"].is_null());
}

TEST_F(AgentClusterTest, AJobRunningWhenTheCoordinatorIsKilledCompletesAfterItsRestart) {
  std::string go = dir_.file("go");
  model::JobId id = submit(two_node("\"while [ ! -e " + go + " ]; do sleep 0.05; done\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::vector<model::JobId> queued;
  for (int i = 0; i < 5; ++i) queued.push_back(submit(two_node("[" CORRAL_WORKER_BIN ", tcp-check]")));
  coord_.kill9();
  ASSERT_NO_FATAL_FAILURE(coordinator_back());
  EXPECT_EQ(job(id)["state"], "RUNNING");
  std::ofstream(go) << "go\n";
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
  // Every job acknowledged before the kill runs afterwards.
  for (model::JobId q : queued) EXPECT_EQ(wait_end(q)["state"], "COMPLETED") << q;
}

TEST_F(AgentClusterTest, CancelAndTimeLimitLeaveNothingRunning) {
  model::JobId cancelled = submit(two_node("[sleep, '300']"));
  ASSERT_TRUE(reaches(cancelled, "RUNNING"));
  std::vector<int> running = pids(job(cancelled));
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(cancelled) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(cancelled)["state"], "CANCELLED");
  EXPECT_TRUE(all_gone(running));

  model::JobId limited = submit(two_node("[sleep, '300']", "time_limit: 1s\n"));
  ASSERT_TRUE(reaches(limited, "RUNNING"));
  running = pids(job(limited));
  Json j = wait_end(limited);
  EXPECT_EQ(j["state"], "TIMEOUT");
  EXPECT_TRUE(all_gone(running));
}

// With node_lost_timeout well past node_timeout, as in production.
class AgentClusterSilenceTest : public AgentClusterTest {
 protected:
  void SetUp() override {
    coord_.add_settings("node_lost_timeout: 60s\n");
    AgentClusterTest::SetUp();
  }
  static bool has_event(const Json& j, const std::string& part) {
    return std::any_of(j["events"].begin(), j["events"].end(), [&](const Json& e) {
      return e["text"].get<std::string>().find(part) != std::string::npos;
    });
  }
};

TEST_F(AgentClusterSilenceTest, AJobRunsOnThroughANodeSilentForLessThanNodeLostTimeoutAndCompletes) {
  // A hung machine or a network blip: gpu-b's agent is stopped for longer than
  // node_timeout. Its ranks run on; when it is back, the job carries on and completes.
  std::string go = dir_.file("go");
  std::string starts = dir_.file("starts");
  model::JobId id =
      submit(two_node("\"echo $RANK >> " + starts + "; while [ ! -e " + go + " ]; do sleep 0.05; done\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::vector<int> running = pids(job(id));
  ASSERT_EQ(running.size(), 4u);
  const pid_t agent_b = b_->process().pid();
  ASSERT_EQ(::kill(agent_b, SIGSTOP), 0);
  struct Continue {  // whatever happens below, the agent runs again for TearDown
    pid_t pid;
    ~Continue() { ::kill(pid, SIGCONT); }
  } resume{agent_b};
  ASSERT_TRUE(eventually([&] { return has_event(job(id), "node gpu-b is silent"); }, 10s)) << job(id).dump(2);
  Json j = job(id);
  EXPECT_EQ(j["state"], "RUNNING") << j.dump(2);
  Json b = Json::parse(call("GET", "/v1/nodes").body)[1];
  EXPECT_EQ(b["name"], "gpu-b");
  EXPECT_EQ(b["state"], "up") << b.dump();
  EXPECT_FALSE(b["silent_since"].is_null()) << b.dump();
  EXPECT_FALSE(b["lost_at"].is_null()) << b.dump();
  ASSERT_EQ(::kill(agent_b, SIGCONT), 0);
  ASSERT_TRUE(eventually([&] { return has_event(job(id), "node gpu-b is back after"); }, 20s))
      << job(id).dump(2);
  b = Json::parse(call("GET", "/v1/nodes").body)[1];
  EXPECT_TRUE(b["silent_since"].is_null()) << b.dump();
  EXPECT_TRUE(b["connected"].get<bool>()) << b.dump();
  EXPECT_EQ(job(id)["state"], "RUNNING");
  EXPECT_EQ(pids(job(id)), running) << "the same ranks, not started again";
  std::ofstream(go) << "go\n";
  j = wait_end(id);
  EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
  // Each rank started once.
  std::ifstream in(starts);
  std::multiset<std::string> ranks;
  for (std::string line; std::getline(in, line);) ranks.insert(line);
  EXPECT_EQ(ranks, (std::multiset<std::string>{"0", "1", "2", "3"}));
}

TEST_F(AgentClusterTest, AWaitIsAnsweredWhenTheJobEndsAndBadWaitsAreRefused) {
  EXPECT_EQ(call("GET", "/v1/jobs/1?wait=61").status, 400);
  EXPECT_EQ(call("GET", "/v1/jobs/1?wait=soon").status, 400);
  model::JobId id = submit(two_node("[sleep, '0.5']"));
  auto asked = std::chrono::steady_clock::now();
  Json j = wait_end(id, 60);
  EXPECT_EQ(j["state"], "COMPLETED");
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 10s);  // answered at the end, not at 60 s
}

TEST_F(AgentClusterTest, AnAgentRestartedWithinNodeLostTimeoutEndsTheJobsOfTheRanksItsPredecessorLeft) {
  // `systemctl restart corral-agent`, or a crash and Restart=on-failure: the agent is
  // back before the coordinator loses the node. The new agent kills the ranks the old
  // one left, so it must say so, or the job would stay RUNNING with no rank alive.
  model::JobId id = submit(two_node("[sleep, '300']"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::vector<int> running = pids(job(id));
  ASSERT_EQ(running.size(), 4u);
  b_->stop();
  EXPECT_TRUE(testing::running(running[2]));
  ASSERT_TRUE(b_->start());
  Json j = wait_end(id);
  // FAILED when the agent was back within node_lost_timeout (the case at stake), NODE_FAIL
  // when a slow machine took longer; either way the job ended and nothing is left.
  EXPECT_TRUE(j["state"] == "FAILED" || j["state"] == "NODE_FAIL") << j.dump(2);
  if (j["state"] == "FAILED") {
    EXPECT_EQ(j["failed_node"], "gpu-b");
    EXPECT_EQ(j["reason"], "RankFailed");
  }
  // Each rank's report is recorded as it comes, the last maybe after the job ended.
  EXPECT_TRUE(eventually(
      [&] {
        Json now = job(id);
        return std::all_of(now["ranks"].begin(), now["ranks"].end(),
                           [](const Json& r) { return r["node"] != "gpu-b" || r["signal"] == SIGKILL; });
      },
      5s))
      << job(id).dump(2);
  EXPECT_TRUE(all_gone(running));
}

// gpu-b's agent SIGKILLed under a running two-node job; its next start reads `apps_csv`
// as the node's compute processes. Returns the job and the UUID of its GPU on gpu-b.
std::pair<model::JobId, std::string> AgentClusterTest::kill_b_under_a_job_then_restart_it_with(
    const std::function<std::string(const std::string& uuid)>& apps_csv) {
  model::JobId id = submit(two_node("[sleep, '300']"));
  EXPECT_TRUE(reaches(id, "RUNNING"));
  Json j = job(id);
  std::string uuid;
  for (const auto& r : j["ranks"]) {
    if (r["node"] == "gpu-b") uuid = r["gpu_uuids"][0];
  }
  EXPECT_FALSE(uuid.empty()) << j.dump(2);
  b_->kill9();
  std::ofstream(dir_.file("apps.csv")) << apps_csv(uuid);
  std::ofstream(sim_, std::ios::app) << "compute_apps: apps.csv\n";  // read by gpu-b's next start only
  EXPECT_TRUE(b_->start());
  return {id, uuid};
}

// gpu-b as soon as it is drained (or as it is after 15 s).
Json AgentClusterTest::node_b_once_drained() {
  Json b;
  EXPECT_TRUE(eventually(
      [&] {
        for (const auto& node : Json::parse(call("GET", "/v1/nodes").body)) {
          if (node["name"] == "gpu-b") b = node;
        }
        return b["state"] == "drained";
      },
      15s))
      << b.dump(2);
  return b;
}

// An agent SIGKILLed under a running job, and a process outside the job (here a plain
// sleep, as a CUDA context the driver has not torn down would be) still on one of the
// job's GPUs on that node. The next agent kills the ranks it finds, learns their GPUs
// from its predecessor's markers (its own survey may not be done), and keeps the node
// out of service, naming the GPU and the process, instead of handing the GPU on.
TEST_F(AgentClusterTest, AGpuStillHeldWhenARestartedAgentSweptItsPredecessorsRanksDrainsTheNode) {
  testing::Child holder;
  ASSERT_TRUE(holder.start({"sleep", "300"}));
  auto [id, uuid] = kill_b_under_a_job_then_restart_it_with(
      [&](const std::string& gpu) { return std::to_string(holder.pid()) + ", " + gpu + ", 1024\n"; });
  const std::string expected = "GPU still in use after job " + std::to_string(id) + " was killed: " + uuid +
                               " by pid " + std::to_string(holder.pid());
  Json b = node_b_once_drained();
  EXPECT_NE(b["reason"].get<std::string>().find(expected), std::string::npos) << b.dump(2);
  Json end = wait_end(id);
  EXPECT_TRUE(end["state"] == "FAILED" || end["state"] == "NODE_FAIL") << end.dump(2);
}

// The same, but the driver cannot be asked (here a compute-apps file nvidia-smi would
// never print): the GPUs are not handed on either, and the reason says it could not tell.
TEST_F(AgentClusterTest, AGpuCheckThatFailsAfterARestartedAgentSweptItsPredecessorsRanksDrainsTheNodeSayingSo) {
  auto [id, uuid] = kill_b_under_a_job_then_restart_it_with([](const std::string& gpu) { return "812, " + gpu + "\n"; });
  Json b = node_b_once_drained();
  const std::string reason = b["reason"].get<std::string>();
  EXPECT_NE(reason.find("cannot tell whether the GPUs of job " + std::to_string(id) + " are free after it was killed: "),
            std::string::npos)
      << b.dump(2);
  EXPECT_NE(reason.find("apps.csv"), std::string::npos) << b.dump(2);
  EXPECT_EQ(reason.find("GPU still in use"), std::string::npos) << b.dump(2);
}

// The pid a file holds; 0 while it holds none.
int pid_in(const std::string& path) {
  int pid = 0;
  std::ifstream(path) >> pid;
  return pid;
}

// A third node whose worker's nccl-root is `root_body` (a shell script's body; the ID is
// its first line out), every other command the real worker's; gpu-a and gpu-b drained so
// that jobs go there.
std::unique_ptr<AgentProcess> AgentClusterTest::nccl_node(const std::string& root_body) {
  std::string worker = dir_.file("fake-worker");
  std::ofstream(worker) << "#!/bin/sh\nif [ \"$1\" = nccl-root ]; then\n" << root_body
                        << "\nfi\nexec " CORRAL_WORKER_BIN " \"$@\"\n";
  std::filesystem::permissions(worker, std::filesystem::perms::owner_all);
  auto c = std::make_unique<AgentProcess>(coord_, dir_, "gpu-c", sim_);
  c->configure("worker: " + worker);
  EXPECT_TRUE(c->start());
  for (const char* node : {"gpu-a", "gpu-b"}) {
    EXPECT_EQ(call("POST", std::string("/v1/nodes/") + node + "/drain", R"({"reason": "not these"})").status, 200);
  }
  return c;
}

// mode: nccl, its bootstrap root a stand-in: every rank gets the root's ID, and the root
// lives until the job ends, then is gone.
TEST_F(AgentClusterTest, ANcclJobsRanksGetTheRootsIdAndTheRootEndsWithTheJob) {
  const std::string id(256, 'c');
  const std::string pid_file = dir_.file("root.pid");
  auto c = nccl_node("echo $$ > " + pid_file + "\necho " + id + "\nexec cat >/dev/null");
  model::JobId job_id = submit("name: n\ncommand: [sh, -c, 'echo id=$CORRAL_NCCL_UNIQUE_ID']\n"
                               "resources: {nodes: 1, gpus_per_node: 2}\nlaunch: {mode: nccl}\n");
  Json j = wait_end(job_id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_EQ(log(job_id, 0), "id=" + id + "\n");
  EXPECT_EQ(log(job_id, 1), "id=" + id + "\n");
  int root = pid_in(pid_file);
  ASSERT_GT(root, 0);
  EXPECT_TRUE(eventually([&] { return !running(root); }, 5s)) << "the root outlived its job";
}

// A job cancelled while its root has not given its ID yet: the root is killed, the job
// ends CANCELLED, and the node's GPUs serve the next job.
TEST_F(AgentClusterTest, ANcclJobCancelledBeforeItsRootAnsweredKillsTheRootAndFreesTheNode) {
  const std::string pid_file = dir_.file("root.pid");
  auto c = nccl_node("echo $$ > " + pid_file + "\nexec sleep 300");
  model::JobId job_id = submit("name: n\ncommand: [sleep, '300']\nresources: {nodes: 1, gpus_per_node: 2}\n"
                               "launch: {mode: nccl}\n");
  int root = 0;
  ASSERT_TRUE(eventually([&] { return (root = pid_in(pid_file)) > 0; }, 10s));
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(job_id) + "/cancel").status, 200);
  Json j = wait_end(job_id);
  EXPECT_EQ(j["state"], "CANCELLED") << j.dump(2);
  EXPECT_TRUE(eventually([&] { return !running(root); }, 5s)) << "the root outlived its job";
  model::JobId next = submit("name: t\ncommand: [\"true\"]\nresources: {nodes: 1, gpus_per_node: 2}\n");
  EXPECT_EQ(wait_end(next)["state"], "COMPLETED");
}

// A root that gives no ID: the Prepare is answered with why, the job does not run, and
// what the Prepare held on the node (its master port) is let go for the next job.
TEST_F(AgentClusterTest, ANcclRootThatGivesNoIdFailsThePrepareSayingWhyAndFreesTheNode) {
  auto c = nccl_node("echo 'no GPU here' >&2\nexit 3");
  model::JobId job_id = submit("name: n\ncommand: [\"true\"]\nresources: {nodes: 1, gpus_per_node: 2}\n"
                               "launch: {mode: nccl}\n");
  Json j = wait_end(job_id);
  EXPECT_NE(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_NE(j.dump().find("nccl-root gave no unique ID: no GPU here"), std::string::npos) << j.dump(2);
  model::JobId next = submit("name: t\ncommand: [\"true\"]\nresources: {nodes: 1, gpus_per_node: 2}\n");
  EXPECT_EQ(wait_end(next)["state"], "COMPLETED");
}

TEST_F(AgentClusterTest, AnAdminsDrainOutlivesTheAgentGoingAwayAndTheCoordinatorRestarting) {
  // Maintenance: drain, stop the agent (or reboot), start it again. The node must come
  // back drained, not up, whatever the coordinator saw meanwhile.
  auto node_b = [&] { return Json::parse(call("GET", "/v1/nodes").body)[1]; };
  model::JobId id = submit(two_node("[sleep, '300']"));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  ASSERT_EQ(call("POST", "/v1/nodes/gpu-b/drain", R"({"reason": "new PSU"})").status, 200);
  b_->stop();
  // node_lost_timeout passes: the job is lost with the node, and the drain stays.
  EXPECT_EQ(wait_end(id)["state"], "NODE_FAIL");
  Json b = node_b();
  EXPECT_EQ(b["state"], "drained") << b.dump();
  EXPECT_EQ(b["reason"], "new PSU");
  EXPECT_EQ(b["connected"], false);
  ASSERT_TRUE(b_->start());
  EXPECT_TRUE(eventually([&] { return job(id)["fences"].empty(); }, 5s));  // gpu-b confirmed clean
  b = node_b();
  EXPECT_EQ(b["state"], "drained") << b.dump();
  EXPECT_EQ(b["connected"], true);

  // A coordinator restart with a job running on gpu-a: the grace ends when gpu-a is
  // back; gpu-b's agent, away, is lost then, and gpu-b stays drained.
  model::JobId one = submit("name: one\ncommand: [sleep, '300']\nresources: {gpus_per_node: 2}\n");
  ASSERT_TRUE(reaches(one, "RUNNING"));
  b_->stop();
  coord_.kill9();
  ASSERT_TRUE(coord_.start());
  http_ = coord_.client(70s);
  ASSERT_TRUE(a_->rejoined());
  EXPECT_TRUE(eventually([&] { return node_b()["connected"] == false && job(one)["state"] == "RUNNING"; }, 5s))
      << node_b().dump() << "\n" << job(one).dump(2);
  // The grace ends and gpu-b, still away, is lost.
  ASSERT_TRUE(coord_.process().wait_for_line("node gpu-b is lost"));
  b = node_b();
  EXPECT_EQ(b["state"], "drained") << b.dump();
  EXPECT_EQ(b["reason"], "new PSU");
  ASSERT_TRUE(b_->start());
  EXPECT_EQ(node_b()["state"], "drained");
  EXPECT_EQ(call("POST", "/v1/nodes/gpu-b/resume").status, 200);
  EXPECT_EQ(node_b()["state"], "up");
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(one) + "/cancel").status, 200);
}

// The issue's first failure, from outside: a job ends while the coordinator is down. Its
// agents hold the exit reports back and send them after the next hello; the job is
// COMPLETED, not requeued or NODE_FAIL, and its command ran once.
TEST_F(AgentClusterTest, AJobThatEndsWhileTheCoordinatorIsDownIsCompletedAndRanOnce) {
  std::string ran_r2 = dir_.file("ran-retries2");
  std::string ran_r0 = dir_.file("ran-retries0");
  std::string done = dir_.file("done");
  // Rank 0 of each job appends a line per run; every rank waits for `done`, then exits 0.
  auto spec = [&](const std::string& file, int retries) {
    return "name: once\ncommand: \"[ $RANK = 0 ] && echo ran >> " + file + "; while [ ! -e " + done +
           " ]; do sleep 0.05; done\"\nretries: " + std::to_string(retries) +
           "\nresources: {nodes: 1, gpus_per_node: 1}\n";
  };
  model::JobId with_retries = submit(spec(ran_r2, 2));
  model::JobId without = submit(spec(ran_r0, 0));
  ASSERT_TRUE(reaches(with_retries, "RUNNING"));
  ASSERT_TRUE(reaches(without, "RUNNING"));
  std::vector<std::pair<model::JobId, AgentProcess*>> where;
  for (model::JobId id : {with_retries, without}) {
    where.emplace_back(id, job(id)["ranks"][0]["node"] == "gpu-a" ? a_.get() : b_.get());
  }
  coord_.kill9();
  std::ofstream(done) << "done\n";
  // Both ranks end while no coordinator runs: each agent logs the end it holds back.
  for (auto [id, agent] : where) {
    std::string line = "job " + std::to_string(id) + " rank 0 exited with code 0";
    ASSERT_TRUE(eventually(
        [&] {
          auto all = agent->process().lines();
          return std::any_of(all.begin(), all.end(), [&](const std::string& l) { return l.find(line) != std::string::npos; });
        },
        10s))
        << line;
  }
  // The ends are dated by the agents that saw them, before the coordinator came back.
  const std::string restarted = format_time(SystemClock().now());
  ASSERT_TRUE(coord_.start());
  http_ = coord_.client(70s);
  for (model::JobId id : {with_retries, without}) {
    Json j = wait_end(id);
    EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
    EXPECT_EQ(j["attempt"], 0);
    EXPECT_EQ(j["exit_code"], 0);
    ASSERT_TRUE(j["ended_at"].is_string()) << j.dump(2);
    EXPECT_LT(j["ended_at"].get<std::string>(), restarted) << "dated when the coordinator heard of the end";
  }
  auto lines = [](const std::string& path) {
    std::ifstream in(path);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line == "ran";
    return n;
  };
  EXPECT_EQ(lines(ran_r2), 1) << "the job with retries ran more than once";
  EXPECT_EQ(lines(ran_r0), 1);
}

// The issue's second failure: GPUs and a port serve the next job only once the previous
// job's ranks are confirmed dead, also a rank that ignores SIGTERM and a process that left
// its rank's process group.
TEST_F(AgentClusterTest, TheNextJobStartsOnlyWhenThePreviousJobsRanksAreDead) {
  std::string pids_file = dir_.file("first.pids");
  std::string seen = dir_.file("seen");
  // Every GPU of both nodes, a 1 s time limit, ranks that ignore SIGTERM (kill_grace 1 s),
  // and one process per rank in a session of its own.
  model::JobId first = submit(two_node("\"trap '' TERM; setsid sleep 61 & echo $! >> " + pids_file +
                                           "; sleep 61 & echo $! >> " + pids_file + "; wait\"",
                                       "time_limit: 1s\n"));
  ASSERT_TRUE(reaches(first, "RUNNING"));
  // Queued for the same GPUs: it records which of the first job's processes it can see.
  model::JobId second = submit(two_node("\"for p in $(cat " + pids_file +
                                        "); do kill -0 $p 2>/dev/null && echo alive $p; done >> " + seen +
                                        "; echo checked >> " + seen + "\""));
  Json j = wait_end(first);
  EXPECT_EQ(j["state"], "TIMEOUT") << j.dump(2);
  Json s2 = wait_end(second);
  EXPECT_EQ(s2["state"], "COMPLETED") << s2.dump(2);
  std::ifstream in(seen);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all.find("alive"), std::string::npos) << "the next job saw the previous job's processes:\n" << all;
  EXPECT_NE(all.find("checked"), std::string::npos);
  // The first job's port was free for the second, not "in use outside corral".
  EXPECT_EQ(s2["master_port"], j["master_port"]);
  bool ending_shown = false;
  for (const auto& e : j["events"]) {
    ending_shown = ending_shown || e["text"].get<std::string>().find("-> ENDING (TIMEOUT") != std::string::npos;
  }
  EXPECT_TRUE(ending_shown) << j["events"].dump(1);
  // The second job started after the first had ended, i.e. after every rank was gone.
  EXPECT_GE(s2["started_at"].get<std::string>(), j["ended_at"].get<std::string>());
}

// Once a rank has ended and its process group is empty, the kernel may give the group's id
// to any new process. The job's end must not kill that process: here it is made to get
// the id at once (ns_last_pid), as pid reuse would give it after the pids wrap.
TEST_F(AgentClusterTest, AProcessGivenTheIdOfAnEndedRanksGroupOutlivesTheJob) {
  if (::access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
    GTEST_SKIP() << "needs a writable ns_last_pid (root)";
  model::JobId id = submit(two_node("\"if [ $RANK = 0 ]; then exit 0; fi; exec sleep 300\""));
  // Rank 0 may exit before every rank's start is confirmed (STARTING): wait for both.
  ASSERT_TRUE(eventually(
      [&] {
        Json j = job(id);
        return j["ranks"][0]["state"] == "EXITED" && j["state"] == "RUNNING";
      },
      10s))
      << job(id).dump(2);
  const int group = job(id)["ranks"][0]["pid"].get<int>();
  ASSERT_FALSE(testing::running(group));
  testing::Child stranger;
  // Other processes fork too: try until the stranger gets the id.
  for (int tries = 0; tries < 50 && stranger.pid() != group; ++tries) {
    if (stranger.pid() > 0) stranger.kill_and_wait(SIGKILL);
    std::ofstream("/proc/sys/kernel/ns_last_pid") << group - 1;
    ASSERT_TRUE(stranger.start({"/bin/sleep", "300"}));
  }
  ASSERT_EQ(stranger.pid(), group) << "the id was taken by another process";
  ASSERT_TRUE(eventually([&] { return ::getpgid(group) == group; }, 5s))
      << "the stranger leads a group of that id";
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel").status, 200);
  EXPECT_EQ(wait_end(id)["state"], "CANCELLED");
  // Its GPUs come back once gpu-a's agent has swept the attempt.
  ASSERT_TRUE(eventually(
      [&] { return Json::parse(call("GET", "/v1/nodes").body)[0]["gpus"][0]["job"].is_null(); }, 10s));
  EXPECT_TRUE(testing::running(stranger.pid())) << "the sweep of the ended job killed an unrelated process";
}

// A rank's end is the agent's to report until the coordinator acknowledges it, whatever
// is killed meanwhile: here every rank exits 0 while the coordinator is down, and both
// agents are SIGKILLed holding their reports. The agents started next report them.
TEST_F(AgentClusterTest, RanksThatExitedZeroWhileNoReportCouldLeaveTheNodeMakeTheJobCompleted) {
  std::string go = dir_.file("go");
  model::JobId id = submit(two_node("\"while [ ! -e " + go + " ]; do sleep 0.05; done; echo done $RANK\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  std::vector<int> ranks = pids(job(id));
  ASSERT_EQ(ranks.size(), 4u);
  coord_.kill9();
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(all_gone(ranks));
  // Each agent has reaped its ranks (and said so in its log) before it is killed.
  for (auto* agent : {a_.get(), b_.get()}) {
    ASSERT_TRUE(eventually(
        [&] {
          auto lines = agent->process().lines();
          return std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
                   return l.find("exited with code 0") != std::string::npos;
                 }) == 2;
        },
        5s));
    agent->kill9();
  }
  ASSERT_TRUE(coord_.start());
  http_ = coord_.client(70s);
  ASSERT_TRUE(a_->start());
  ASSERT_TRUE(b_->start());
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
  for (const auto& r : j["ranks"]) {
    EXPECT_EQ(r["state"], "EXITED") << r.dump();
    EXPECT_EQ(r["exit_code"], 0) << r.dump();
  }
}

// A rank finds none of the agent's descriptors (its link to the coordinator, logs, pipes)
// among its own: only stdin, stdout and stderr.
TEST_F(AgentClusterTest, ARankHoldsNoDescriptorOfTheAgent) {
  // ls lists its own descriptors; 3 is the directory it reads them from.
  model::JobId id = submit("name: fds\ncommand: [sh, -c, 'exec ls /proc/self/fd']\nresources: {nodes: 1, gpus_per_node: 1}\n");
  Json j = wait_end(id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_EQ(log(id, 0), "0\n1\n2\n3\n");
}

// A node whose agent caps rank logs at 64 KiB; gpu-a and gpu-b drained so that jobs go there.
std::unique_ptr<AgentProcess> AgentClusterTest::node_c(const std::string& config, const std::string& spool_mount) {
  auto c = std::make_unique<AgentProcess>(coord_, dir_, "gpu-c", sim_);
  c->configure(config);
  if (!spool_mount.empty()) {
    std::filesystem::create_directories(c->spool());
    if (::mount("tmpfs", c->spool().c_str(), "tmpfs", 0, spool_mount.c_str()) != 0) return nullptr;
    mounted_ = c->spool();
  }
  EXPECT_TRUE(c->start());
  for (const char* node : {"gpu-a", "gpu-b"}) {
    EXPECT_EQ(call("POST", std::string("/v1/nodes/") + node + "/drain", R"({"reason": "not these"})").status, 200);
  }
  return c;
}

// A rank's log read as corral logs reads it: from each answer's end, until it is all read.
Json AgentClusterTest::whole_log(model::JobId id, int rank, std::string& text) {
  std::uint64_t offset = 0;
  for (;;) {
    auto r = call("GET", "/v1/jobs/" + std::to_string(id) + "/logs?rank=" + std::to_string(rank) +
                             "&offset=" + std::to_string(offset));
    if (r.status != 200) return Json{{"status", r.status}, {"body", r.body}};
    Json chunk = Json::parse(r.body);
    const std::string data = chunk["data"].get<std::string>();
    text += data;
    offset = chunk["offset"].get<std::uint64_t>() + data.size();
    if (data.empty() || offset >= chunk["size"].get<std::uint64_t>()) return chunk;
  }
}

TEST_F(AgentClusterTest, ALogPastTheAgentsCapKeepsItsHeadAndTailAndTheAnswerSaysItWasCut) {
  auto c = node_c("rank_log_cap: 64KiB");
  // About 590 KB, nine times the cap.
  model::JobId id = submit("name: loud\ncommand: [seq, '100000']\nresources: {nodes: 1, gpus_per_node: 1}\n");
  Json j = wait_end(id);
  ASSERT_EQ(j["state"], "COMPLETED") << j.dump(2);
  // Looked at once more after the rank ended (within a second).
  std::string text;
  Json last;
  ASSERT_TRUE(eventually([&] {
    text.clear();
    last = whole_log(id, 0, text);
    return last.value("cut", 0) > 0;
  }, 5s)) << last.dump();
  const std::string marker = "\n[corral: " + std::to_string(last["cut"].get<std::uint64_t>()) + " bytes cut from this log]\n";
  EXPECT_NE(text.find(marker), std::string::npos) << text.substr(0, 200);
  EXPECT_EQ(text.rfind("1\n2\n3\n", 0), 0u);
  EXPECT_TRUE(text.ends_with("99999\n100000\n"));
  EXPECT_LE(text.size(), 64u * 1024 + 1024);
  struct stat st {};
  ASSERT_EQ(::stat((c->spool() + "/jobs/" + std::to_string(id) + "/0/rank-0.log").c_str(), &st), 0);
  EXPECT_LE(st.st_blocks * 512, 80 * 1024);
  EXPECT_EQ(last.value("lost", ""), "");
}

// A spool that cannot take a write (a full 4 MiB tmpfs) under a running job: the node
// drains saying why, the job's rank is warned that its log may have lost output and
// corral logs' answer says so; the node takes jobs again once there is room. (A rank
// whose log cannot be made at launch does not start: LogCap.AFullSpoolRefusesARanksLog...)
TEST_F(AgentClusterTest, AFullSpoolDrainsTheNodeAndSaysTheRunningRanksLogMayHaveLostOutput) {
  auto c = node_c("", "size=4m");
  if (c == nullptr) GTEST_SKIP() << "cannot mount a tmpfs for the spool (needs root)";
  // The rank waits for the test on a FIFO outside the spool.
  const std::string fifo = dir_.file("go");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  model::JobId id = submit("name: lost\ncommand: [sh, -c, 'echo before; read x < " + fifo +
                           "']\nresources: {nodes: 1, gpus_per_node: 1}\n");
  ASSERT_TRUE(reaches(id, "RUNNING"));
  {
    std::ofstream filler(c->spool() + "/filler", std::ios::binary);
    const std::string block(4096, 'f');
    while (filler.write(block.data(), block.size())) filler.flush();
  }
  auto node_c_state = [&] {
    for (const auto& node : Json::parse(call("GET", "/v1/nodes").body)) {
      if (node["name"] == "gpu-c") return node;
    }
    return Json{};
  };
  Json n;
  EXPECT_TRUE(eventually([&] { n = node_c_state(); return n["state"] == "drained"; }, 5s)) << n.dump(2);
  EXPECT_NE(n["reason"].get<std::string>().find("spool cannot take rank logs: the spool " + c->spool() + " is full"),
            std::string::npos)
      << n.dump(2);
  Json j;
  EXPECT_TRUE(eventually([&] { j = job(id); return !j["ranks"][0]["warnings"].empty(); }, 5s)) << j.dump(2);
  EXPECT_NE(j["ranks"][0]["warnings"][0].get<std::string>().find("its log may have lost output: "), std::string::npos)
      << j.dump(2);
  std::ofstream(fifo) << "go\n";
  EXPECT_EQ(wait_end(id)["state"], "COMPLETED");
  auto r = call("GET", "/v1/jobs/" + std::to_string(id) + "/logs?rank=0");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(Json::parse(r.body)["lost"].get<std::string>().find("the spool could not take writes while the rank ran"),
            std::string::npos)
      << r.body;
  std::filesystem::remove(c->spool() + "/filler");
  EXPECT_TRUE(eventually([&] { n = node_c_state(); return n["state"] == "up"; }, 5s)) << n.dump(2);
}

// The issue's third failure: a node whose agent is known to be disconnected gets no job.
TEST_F(AgentClusterTest, NoJobGoesToANodeWhoseAgentIsDisconnected) {
  b_->kill9();
  ASSERT_TRUE(eventually([&] { return Json::parse(call("GET", "/v1/nodes").body)[1]["connected"] == false; }, 5s));
  model::JobId id = submit(two_node("[sleep, '0']"));
  Json j = job(id);
  EXPECT_EQ(j["state"], "PENDING") << j.dump(2);
  EXPECT_EQ(j["reason"], "NodeDown");
  EXPECT_NE(j["detail"].get<std::string>().find("gpu-b"), std::string::npos) << j["detail"];
  ASSERT_TRUE(b_->start());
  EXPECT_EQ(wait_end(id)["state"], "COMPLETED");
}

// The issue's first defect, tried as an operator would: the database is deleted under a
// running job. The coordinator refuses to start; a new cluster started on purpose holds
// the agents (their ranks live on, the nodes are drained saying why); the old database
// back, the job carries on and completes, having run once.
TEST_F(AgentClusterTest, ADeletedDatabaseKillsNoRankAndTheClusterCarriesOnWhenItIsBack) {
  const std::string go = dir_.file("go");
  const std::string ran = dir_.file("ran");
  model::JobId id = submit(two_node("\"[ $RANK = 0 ] && echo ran >> " + ran + "; while [ ! -e " + go +
                                    " ]; do sleep 0.05; done\""));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  ASSERT_TRUE(eventually([&] { return pids(job(id)).size() == 4; }, 10s));
  const std::vector<int> ranks = pids(job(id));
  const std::string state = dir_.file("state");
  const std::string db = coord_.database();
  coord_.kill9();
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    std::filesystem::rename(db + suffix, dir_.file(std::string("kept.db") + suffix), ec);
  }
  ASSERT_FALSE(coord_.start()) << "a coordinator started on a missing database";
  int status = coord_.process().wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;

  auto made = testing::run_to_end({CORRAL_COORDINATOR_BIN, "new-database", "--state-dir", state, "--admin", "other"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string new_token = made.out.substr(0, made.out.find('\n'));
  ASSERT_TRUE(coord_.start());
  http_ = coord_.client(70s);
  for (auto* agent : {a_.get(), b_.get()}) {
    ASSERT_TRUE(agent->process().wait_for_line("obeying none of its orders")) << "the agent did not hold";
  }
  ASSERT_TRUE(eventually(
      [&] {
        auto r = http_->request("GET", "/v1/nodes", "", {{"Authorization", "Bearer " + new_token}});
        if (!r || r->status != 200) return false;
        Json nodes = Json::parse(r->body);
        return nodes.size() == 2 && std::all_of(nodes.begin(), nodes.end(), [](const Json& n) {
                 return n["state"] == "drained" && n["reason"].get<std::string>().rfind("held: ", 0) == 0;
               });
      },
      10s))
      << "the new cluster's nodes are not shown held";
  for (int pid : ranks) EXPECT_TRUE(running(pid)) << "rank pid " << pid << " was killed on a new cluster's word";

  // The operator puts the cluster's database and identity back.
  coord_.kill9();
  std::filesystem::remove(db);
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    std::filesystem::rename(dir_.file(std::string("kept.db") + suffix), db + suffix, ec);
  }
  std::filesystem::rename(state + "/cluster-id.previous", state + "/cluster-id");
  ASSERT_NO_FATAL_FAILURE(coordinator_back());
  EXPECT_EQ(job(id)["state"], "RUNNING");
  std::ofstream(go) << "go\n";
  Json j = wait_end(id);
  EXPECT_EQ(j["state"], "COMPLETED") << j.dump(2);
  EXPECT_EQ(j["attempt"], 0);
  std::ifstream runs(ran);
  int n = 0;
  for (std::string line; std::getline(runs, line);) n += line == "ran";
  EXPECT_EQ(n, 1) << "the job ran more than once";
  Json nodes = Json::parse(call("GET", "/v1/nodes").body);
  for (const auto& node : nodes) EXPECT_EQ(node["state"], "up") << node.dump();
}

}  // namespace
}  // namespace corral
