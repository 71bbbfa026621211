// The real `corral` binary, as a person or a script runs it, against a real coordinator
// and two real agents (simulated inventories) over TLS on loopback: run, spec-less
// submit, standard input, filters, bulk cancel, logs -f on a pending job, Ctrl-C.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/cluster.hpp"
#include "tests/support/eventually.hpp"

namespace corral {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testing::AgentProcess;
using testing::CoordinatorProcess;
using testing::current_user;
using testing::eventually;
using testing::running;

using testing::Outcome;

class CliClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(sim_) << "driver: \"550.54.15\"\ncuda: \"12.4\"\n"
                           "gpus: [{name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}]\n";
    ASSERT_TRUE(coord_.init_ok());
    ASSERT_TRUE(coord_.start());
    a_ = std::make_unique<AgentProcess>(coord_, dir_, "gpu-a", sim_);
    b_ = std::make_unique<AgentProcess>(coord_, dir_, "gpu-b", sim_);
    ASSERT_TRUE(a_->start());
    ASSERT_TRUE(b_->start());
  }

  void TearDown() override {
    corral({"cancel", "--state", "PENDING,STARTING,RUNNING"});
    // The keeper would end with the test's folder anyway; a test that failed midway may
    // have left one busy.
    if (pid_t keeper = keeper_pid(); keeper > 0) ::kill(keeper, SIGKILL);
    if (HasFailure()) {
      for (const auto& line : coord_.process().lines()) std::cerr << "coordinator: " << line << "\n";
    }
  }

  // A person's environment: the connection keeper (cli/keeper.hpp) on, as by default, in a
  // runtime folder of the test's, so that a keeper ends with the test's folder.
  std::vector<std::string> env(const std::string& token = {}) const {
    return {"XDG_RUNTIME_DIR=" + runtime_, "CORRAL_KEEP_CONNECTION=600", "HOME=" + dir_.path().string(), "XDG_CONFIG_HOME=" + dir_.file("xdg"), "CORRAL_URL=" + coord_.url(),
            "CORRAL_TOKEN=" + (token.empty() ? coord_.token() : token), "CORRAL_CA=" + coord_.ca()};
  }

  // `corral args...`, to its end.
  Outcome corral(const std::vector<std::string>& args, const std::string& token = {}) {
    std::vector<std::string> argv{CORRAL_CLI_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, token);
  }

  // A shell line with `corral` on its PATH's front, for pipes.
  Outcome shell(const std::string& line) {
    std::string bin = CORRAL_CLI_BIN;
    return run({"/bin/sh", "-c", "PATH=" + bin.substr(0, bin.rfind('/')) + ":$PATH; " + line}, {});
  }

  Outcome run(const std::vector<std::string>& argv, const std::string& token) {
    return testing::run_to_end(argv, env(token));
  }

  Json job(std::int64_t id) {
    auto o = corral({"show", std::to_string(id), "--json"});
    return o.exit_code == 0 ? Json::parse(o.out) : Json{};
  }

  // The connection keeper's socket in the test's runtime folder, or empty.
  std::string keeper_socket() const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(runtime_ + "/corral", ec)) {
      std::string name = e.path().filename().string();
      if (name.starts_with("keeper-") && !name.ends_with(".lock")) return e.path().string();
    }
    return {};
  }

  // The pid of the process serving the keeper's socket (by SO_PEERCRED), or 0.
  pid_t keeper_pid() const {
    std::string path = keeper_socket();
    if (path.empty()) return 0;
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ucred cred{};
    socklen_t len = sizeof(cred);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
              ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    ::close(fd);
    return ok ? cred.pid : 0;
  }


  testing::TempDir dir_;
  std::string runtime_ = [this] {
    std::string d = dir_.file("xdg-run");
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  std::string sim_ = dir_.file("sim.yaml");
  // Every coordinator here also listens on a local socket, which one test uses alone.
  std::string socket_ = dir_.file("run/coordinator.sock");
  CoordinatorProcess coord_{dir_, "local_socket: " + socket_ + "\n", current_user()};
  std::unique_ptr<AgentProcess> a_;
  std::unique_ptr<AgentProcess> b_;
};

TEST_F(CliClusterTest, RunStreamsEveryRanksLinesLabelledAndExitsWithTheJobsCode) {
  auto o = corral({"run", "-N", "2", "--gpus-per-node", "2", "--label", "--", "sh", "-c",
                   "echo \"rank $RANK of $WORLD_SIZE\"; echo \"bye $RANK\""});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  for (int r = 0; r < 4; ++r) {
    std::string rank = std::to_string(r);
    EXPECT_NE(o.out.find(rank + ": rank " + rank + " of 4\n"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find(rank + ": bye " + rank + "\n"), std::string::npos) << o.out;
  }
  // A rank that fails at once: its output is all there, and its code is corral's.
  for (int i = 0; i < 3; ++i) {
    o = corral({"run", "--gpus", "1", "--", "sh", "-c", "echo failing; exit 3"});
    EXPECT_EQ(o.exit_code, 3) << o.err;
    EXPECT_EQ(o.out, "failing\n");
    EXPECT_NE(o.err.find("FAILED (RankFailed): rank 0 on gpu-"), std::string::npos) << o.err;
  }
  o = corral({"run", "-N", "2", "--gpus-per-node", "1", "--rank", "1", "--", "sh", "-c", "echo $RANK"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "1\n");
}

// `corral` on the coordinator's machine through its local socket: no CA, no TLS, the
// token still required; run, submit, wait, show, queue and nodes as over TLS.
TEST_F(CliClusterTest, EveryCommandWorksThroughTheLocalSocketWithItsToken) {
  const std::vector<std::string> local = {"HOME=" + dir_.path().string(), "XDG_CONFIG_HOME=" + dir_.file("xdg"),
                                          "CORRAL_URL=unix:" + socket_, "CORRAL_TOKEN=" + coord_.token()};
  auto corral_local = [&](std::vector<std::string> args, std::vector<std::string> env) {
    args.insert(args.begin(), CORRAL_CLI_BIN);
    return testing::run_to_end(args, env);
  };
  // Not a CA in sight: CORRAL_CA unset and no config file.
  auto o = corral_local({"run", "-N", "2", "--gpus-per-node", "1", "--label", "--", "sh", "-c", "echo rank $RANK"},
                        local);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("0: rank 0\n"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("1: rank 1\n"), std::string::npos) << o.out;
  o = corral_local({"submit", "--parsable", "--gpus", "1", "--", "sh", "-c", "exit 0"}, local);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::string id = o.out.substr(0, o.out.find('\n'));
  o = corral_local({"wait", id, "--timeout", "30", "--json"}, local);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(Json::parse(o.out)["state"], "COMPLETED") << o.out;
  // The same job, seen over TLS.
  EXPECT_EQ(job(std::stoll(id))["state"], "COMPLETED");
  o = corral_local({"nodes", "--json"}, local);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(Json::parse(o.out).size(), 2u) << o.out;
  o = corral_local({"queue", "--all", "--json"}, local);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  // A wrong token is refused there as over TLS, and changes nothing.
  auto wrong = local;
  wrong.back() = "CORRAL_TOKEN=not-a-token";
  o = corral_local({"submit", "--gpus", "1", "--", "true"}, wrong);
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_TRUE(o.err.starts_with("corral: not authenticated: ")) << o.err;
  EXPECT_EQ(Json::parse(corral({"queue", "--all", "--json"}).out).size(),
            Json::parse(corral_local({"queue", "--all", "--json"}, local).out).size());
}

TEST_F(CliClusterTest, RunOfASpecFileTakesTheFlagsOverTheSpec) {
  std::ofstream(dir_.file("job.yaml")) << "name: from-file\ncommand: echo $WORLD_SIZE\nresources: {gpus: 1}\n";
  auto o = corral({"run", dir_.file("job.yaml"), "--nodes", "2", "--gpus-per-node", "2", "--rank", "0"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "4\n");
}

TEST_F(CliClusterTest, CtrlCCancelsTheJobAndASecondWithinASecondLeavesItRunning) {
  for (bool twice : {false, true}) {
    testing::Child child;
    std::vector<std::string> argv{CORRAL_CLI_BIN, "run", "--name", twice ? "left" : "stopped", "--gpus", "1", "--",
                                  "sleep", "60"};
    ASSERT_TRUE(child.start(argv, env()));
    std::int64_t id = 0;
    ASSERT_TRUE(eventually([&] {
      auto q = corral({"queue", "--state", "RUNNING", "--json"});
      for (const auto& j : Json::parse(q.out.empty() ? "[]" : q.out)) {
        if (j["name"] == (twice ? "left" : "stopped")) id = j["id"];
      }
      return id != 0;
    }, 20s));
    ::kill(child.pid(), SIGINT);
    if (twice) {
      ASSERT_TRUE(child.wait_for_line("Ctrl-C again within 1 s leaves it running", 5s));
      ::kill(child.pid(), SIGINT);
    }
    child.read_stdout();
    int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status));
    if (twice) {
      EXPECT_EQ(WEXITSTATUS(status), 130);
      EXPECT_TRUE(child.wait_for_line("left running", 1s));
      EXPECT_EQ(job(id)["state"], "RUNNING");
      EXPECT_EQ(corral({"cancel", std::to_string(id)}).exit_code, 0);
    } else {
      EXPECT_EQ(WEXITSTATUS(status), 125);  // as `wait` says for CANCELLED
      EXPECT_EQ(job(id)["state"], "CANCELLED");
    }
  }
}

TEST_F(CliClusterTest, SpecLessSubmitStandardInputAndLogsFollowOnAPendingJob) {
  // The cluster is full: the next job waits, and `logs -f` waits with it.
  auto blocker = corral({"submit", "--parsable", "-N", "2", "--gpus-per-node", "2", "--name", "blocker", "--",
                         "sleep", "60"});
  ASSERT_EQ(blocker.exit_code, 0) << blocker.err;
  const std::string blocker_id = blocker.out.substr(0, blocker.out.find('\n'));
  auto waiting = shell("printf 'name: piped\\ncommand: echo from stdin\\nresources: {gpus_per_node: 1}\\n' | "
                       "corral submit - --parsable");
  ASSERT_EQ(waiting.exit_code, 0) << waiting.err;
  const std::string id = waiting.out.substr(0, waiting.out.find('\n'));
  EXPECT_EQ(job(std::stoll(id))["state"], "PENDING");
  EXPECT_EQ(job(std::stoll(id))["name"], "piped");
  testing::Child follow;
  ASSERT_TRUE(follow.start({CORRAL_CLI_BIN, "logs", "-f", id}, env()));
  ASSERT_TRUE(follow.wait_for_line("is PENDING", 10s));
  EXPECT_EQ(corral({"cancel", blocker_id}).exit_code, 0);
  EXPECT_EQ(follow.read_stdout(), "from stdin\n");
  EXPECT_EQ(WEXITSTATUS(follow.wait()), 0) << [&] {
    std::string said;
    for (const auto& line : follow.lines()) said += line + "\n";
    return said;
  }();
  // Spec-less: the command after -- is executed as typed, named after its program.
  auto o = corral({"submit", "--json", "--", "/bin/echo", "a b", "$HOME"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::int64_t spec_less = Json::parse(o.out)["id"];
  EXPECT_EQ(corral({"wait", std::to_string(spec_less)}).exit_code, 0);
  EXPECT_EQ(job(spec_less)["name"], "echo");
  EXPECT_EQ(corral({"logs", std::to_string(spec_less)}).out, "a b $HOME\n");
}

TEST_F(CliClusterTest, QueueFiltersAndBulkCancelByStateAndById) {
  std::string bob = coord_.add_user("bob");
  auto submit = [&](const std::string& name, const std::string& token = {}) {
    auto o = corral({"submit", "--parsable", "-N", "2", "--gpus-per-node", "2", "--name", name, "--", "sleep", "60"},
                    token);
    EXPECT_EQ(o.exit_code, 0) << o.err;
    return o.out.substr(0, o.out.find('\n'));
  };
  std::string mine1 = submit("mine1");
  std::string mine2 = submit("mine2");
  std::string bobs = submit("bobs", bob);
  ASSERT_TRUE(eventually([&] { return job(std::stoll(mine1))["state"] == "RUNNING"; }, 20s));
  auto q = corral({"queue", "--state", "PD", "--user", "bob," + current_user()});
  EXPECT_EQ(q.exit_code, 0) << q.err;
  EXPECT_NE(q.out.find("mine2"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("bobs"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("mine1"), std::string::npos) << q.out;
  q = corral({"queue", "--me"}, bob);
  EXPECT_NE(q.out.find("bobs"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("mine"), std::string::npos) << q.out;
  EXPECT_EQ(corral({"queue", "--state", "SLEEPING"}).exit_code, 2);
  // Bob may not cancel mine; his own goes, and the refusal is named.
  auto c = corral({"cancel", mine2, bobs}, bob);
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_EQ(c.out, "Cancelled job " + bobs + "\n");
  EXPECT_NE(c.err.find("job " + mine2 + " belongs to " + current_user()), std::string::npos) << c.err;
  // My pending ones, by state: mine2 only; mine1 runs on.
  c = corral({"cancel", "--state", "PENDING"});
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out, "Cancelled job " + mine2 + "\n");
  EXPECT_EQ(job(std::stoll(mine1))["state"], "RUNNING");
}

// A person's successive commands resume the TLS session the first one kept: the CA is not
// even read, until a restarted coordinator refuses the ticket.
TEST_F(CliClusterTest, SuccessiveCommandsResumeTheKeptTlsSessionAndReadTheCaAgainAfterARestart) {
  const std::string ca = dir_.file("my-ca.pem");
  const std::string ca_text = [&] {
    std::ifstream in(coord_.ca());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  std::ofstream(ca) << ca_text;
  auto env_with_ca = env();
  env_with_ca.back() = "CORRAL_CA=" + ca;
  env_with_ca.push_back("CORRAL_KEEP_CONNECTION=0");  // each command on its own
  auto queue = [&] { return testing::run_to_end({CORRAL_CLI_BIN, "queue", "--json"}, env_with_ca); };
  auto o = queue();
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const std::string kept = dir_.file("xdg") + "/corral/tls-session";
  struct stat st {};
  ASSERT_EQ(::stat(kept.c_str(), &st), 0) << "no session kept";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir_.file("xdg") + "/corral").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "the config folder, made for the session, is the user's alone";

  std::ofstream(ca) << "not a certificate\n";
  for (int i = 0; i < 2; ++i) {
    o = queue();
    EXPECT_EQ(o.exit_code, 0) << "not resumed: " << o.err;
  }
  // The restarted coordinator's ticket key is new: a full handshake, which needs the CA.
  coord_.kill9();
  ASSERT_TRUE(coord_.start());
  o = queue();
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_TRUE(o.err.starts_with("corral: cannot load CA " + ca + ": not a usable PEM file")) << o.err;
  std::ofstream(ca) << ca_text;
  o = queue();
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::ofstream(ca) << "not a certificate\n";
  o = queue();
  EXPECT_EQ(o.exit_code, 0) << "the new ticket was not kept: " << o.err;
}

TEST_F(CliClusterTest, DependenciesHoldThroughACoordinatorRestartAndACancelledOneEndsDependencyNeverSatisfied) {
  auto id = [](const Outcome& o) { return o.out.substr(0, o.out.find('\n')); };
  // The first job runs until the test lets it end (after the restart), however slow the machine.
  const std::string gate = dir_.file("first-may-end");
  std::string first = id(corral({"submit", "--parsable", "-G", "1", "--", "sh", "-c",
                                 "while [ ! -e " + gate + " ]; do sleep 0.05; done"}));
  std::string after_ok = id(corral({"submit", "--parsable", "-G", "1", "--after-ok", first, "--", "echo", "ok"}));
  std::string after_not_ok =
      id(corral({"submit", "--parsable", "-G", "1", "--after-not-ok", first, "--", "echo", "not ok"}));
  auto shown = corral({"show", after_ok});
  EXPECT_NE(shown.out.find("Dependency"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("waiting for job " + first + " to complete (after_ok)"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("Depends on:  after_ok " + first), std::string::npos) << shown.out;
  coord_.kill9();
  ASSERT_TRUE(coord_.start());
  ASSERT_TRUE(a_->rejoined());
  ASSERT_TRUE(b_->rejoined());
  EXPECT_EQ(job(std::stoll(after_ok))["reason"], "Dependency");
  std::ofstream(gate).put('\n');
  EXPECT_EQ(corral({"wait", after_ok, "--timeout", "30"}).exit_code, 0);
  EXPECT_EQ(corral({"logs", after_ok}).out, "ok\n");
  Json never = job(std::stoll(after_not_ok));
  EXPECT_EQ(never["state"], "CANCELLED");
  EXPECT_EQ(never["reason"], "DependencyNeverSatisfied");
  EXPECT_EQ(corral({"submit", "-G", "1", "--after-any", "99999", "--", "true"}).err,
            "corral: after_any: no job 99999\n");
}

TEST_F(CliClusterTest, HistoryListsEndedJobsAndUsageSumsTheirGpuTime) {
  EXPECT_EQ(corral({"run", "-N", "2", "--gpus-per-node", "2", "-J", "four", "--", "sleep", "1"}).exit_code, 0);
  EXPECT_EQ(corral({"run", "-G", "1", "-J", "fails", "--", "sh", "-c", "exit 5"}).exit_code, 5);
  auto h = corral({"history"});
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("four"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("5 (rank 0)"), std::string::npos) << h.out;
  auto failed = corral({"history", "--state", "FAILED", "--json"});
  Json list = Json::parse(failed.out);
  ASSERT_EQ(list.size(), 1u) << failed.out;
  EXPECT_EQ(list[0]["name"], "fails");
  EXPECT_EQ(list[0]["exit_code"], 5);
  EXPECT_EQ(Json::parse(corral({"history", "--until", "2000-01-01", "--since", "1999-01-01", "--json"}).out).size(), 0u);
  EXPECT_EQ(corral({"history", "--since", "soon"}).exit_code, 2);
  auto u = corral({"usage", "--json"});
  ASSERT_EQ(u.exit_code, 0) << u.err;
  Json usage = Json::parse(u.out);
  ASSERT_EQ(usage["rows"].size(), 1u) << u.out;
  EXPECT_EQ(usage["rows"][0]["user"], current_user());
  EXPECT_EQ(usage["rows"][0]["jobs"], 2);
  // Four GPUs for at least a second, one GPU for a moment.
  EXPECT_GE(usage["total_gpu_hours"].get<double>(), 4.0 / 3600);
  EXPECT_LT(usage["total_gpu_hours"].get<double>(), 60.0 / 3600);
  auto by_node = Json::parse(corral({"usage", "--by", "node", "--json"}).out);
  EXPECT_EQ(by_node["rows"].size(), 2u) << by_node.dump();
  auto by_class = Json::parse(corral({"usage", "--by", "class", "--json"}).out);
  ASSERT_EQ(by_class["rows"].size(), 1u);
  EXPECT_EQ(by_class["rows"][0]["class"], "NVIDIA A100-SXM4-80GB");
}

TEST_F(CliClusterTest, AnArrayRunsEachIndexWithinItsLimitAndIsCancelledWholeOrByElement) {
  auto o = corral({"submit", "--json", "--array", "0-5%2", "-G", "1", "--", "sh", "-c",
                   "echo $CORRAL_ARRAY_JOB_ID.$CORRAL_ARRAY_INDEX; sleep 60"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  Json answer = Json::parse(o.out);
  const std::int64_t array = answer["id"];
  ASSERT_EQ(answer["ids"].size(), 6u);
  const std::string a = std::to_string(array);
  ASSERT_TRUE(eventually([&] { return job(array + 1)["state"] == "RUNNING"; }, 20s));
  auto q = corral({"queue"});
  EXPECT_NE(q.out.find(a + "_0 "), std::string::npos) << q.out;
  EXPECT_NE(q.out.find(a + "_[2-5%2]  "), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("JobArrayTaskLimit"), std::string::npos) << q.out;
  EXPECT_EQ(corral({"logs", a + "_1"}).out, a + ".1\n");
  // The limit holds across a coordinator restart.
  coord_.kill9();
  ASSERT_TRUE(coord_.start());
  ASSERT_TRUE(a_->rejoined());
  ASSERT_TRUE(b_->rejoined());
  EXPECT_EQ(job(array + 2)["reason"], "JobArrayTaskLimit");
  // One element by ARRAY_INDEX: the next one takes its place.
  EXPECT_EQ(corral({"cancel", a + "_1"}).out, "Cancelled job " + a + "_1 (state ENDING)\n");
  ASSERT_TRUE(eventually([&] { return job(array + 2)["state"] == "RUNNING"; }, 20s));
  EXPECT_EQ(job(array + 3)["state"], "PENDING");
  // The array's id: every live element.
  auto c = corral({"cancel", a});
  EXPECT_EQ(c.out, "Cancelled array " + a + " (5 live elements)\n") << c.err;  // 0, 2 running; 3-5 pending
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(eventually([&] {
      std::string st = job(array + i)["state"];
      return st == "CANCELLED";
    }, 20s)) << i;
  }
  EXPECT_EQ(corral({"show", a + "_9"}).exit_code, 1);
}

TEST_F(CliClusterTest, MetricsPassPromtoolAndCountGpusJobsAndWaitsAsTheyAre) {
  auto running = corral({"submit", "--parsable", "-N", "2", "--gpus-per-node", "1", "--", "sleep", "60"});
  ASSERT_EQ(running.exit_code, 0) << running.err;
  ASSERT_EQ(corral({"run", "-G", "1", "--", "true"}).exit_code, 0);
  ASSERT_EQ(corral({"submit", "-G", "1", "--after-ok", running.out.substr(0, running.out.find('\n')), "--", "true"}).exit_code, 0);
  ASSERT_TRUE(eventually([&] { return job(std::stoll(running.out))["state"] == "RUNNING"; }, 20s));
  auto http = coord_.client();
  ASSERT_TRUE(http);
  auto r = http->request("GET", "/metrics", "", {});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200);
  const std::string& m = r->body;
  for (const char* series : {"corral_build_info{version=\"0.", "corral_jobs_pending{reason=\"Dependency\"} 1\n",
                                                          "corral_gpus{node=\"gpu-a\",class=\"NVIDIA A100-SXM4-80GB\",state=\"allocated\"} 1\n",
                             "corral_gpus{node=\"gpu-b\",class=\"NVIDIA A100-SXM4-80GB\",state=\"free\"} 1\n",
                             "corral_node_up{node=\"gpu-a\"} 1\n", "corral_agent_last_heartbeat_seconds{node=\"gpu-b\"} ",
                             "corral_job_queue_wait_seconds_count{class=\"NVIDIA A100-SXM4-80GB\"} 2\n",
                             "corral_job_run_seconds_count 1\n", "corral_store_commit_seconds_bucket{le=\"+Inf\"} "}) {
    EXPECT_NE(m.find(series), std::string::npos) << series << "\n" << m;
  }
  EXPECT_NE(m.find("corral_jobs_ended_total{state=\"COMPLETED\",user=\"" + current_user() + "\"} 1\n"), std::string::npos)
      << m;
  // The last heartbeat is a Unix time (Prometheus' time() minus it: the silence), now-ish.
  const std::string beat = "corral_agent_last_heartbeat_seconds{node=\"gpu-b\"} ";
  if (auto at = m.find(beat); at != std::string::npos) {
    const double seconds = std::stod(m.substr(at + beat.size()));
    const double unix_now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    EXPECT_NEAR(seconds, unix_now, 60.0) << m;
  }
  EXPECT_NE(m.find("corral_gpus_allocated_by_user{user=\"" + current_user() + "\"} 2\n"), std::string::npos) << m;
  if (::access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool is not installed (Debian: prometheus)";
  std::ofstream(dir_.file("metrics.txt")) << m;
  auto check = run({"/bin/sh", "-c", "promtool check metrics < " + dir_.file("metrics.txt")}, {});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  EXPECT_EQ(check.out + check.err, "");
}

TEST_F(CliClusterTest, EveryProgramSaysItsVersion) {
  for (const char* bin : {CORRAL_CLI_BIN, CORRAL_COORDINATOR_BIN, CORRAL_AGENT_BIN, CORRAL_WORKER_BIN}) {
    auto o = run({bin, "--version"}, {});
    EXPECT_EQ(o.exit_code, 0) << bin;
    std::string name = std::string(bin).substr(std::string(bin).rfind('/') + 1);
    EXPECT_EQ(o.out.rfind(name + " 0.", 0), 0u) << o.out;
  }
}

}  // namespace
}  // namespace corral

namespace corral {
namespace {

// The connection keeper: a command after the first goes through it, reading no CA and
// making no handshake; what it relays is the coordinator's answer, byte for byte.
TEST_F(CliClusterTest, CommandsAfterTheFirstGoThroughTheKeeperWhichReadsNoCaAgain) {
  auto o = corral({"queue"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  pid_t keeper = 0;
  ASSERT_TRUE(eventually([&] { return (keeper = keeper_pid()) > 0; }, 10s)) << "no keeper started";
  struct stat st {};
  ASSERT_EQ(::stat((runtime_ + "/corral").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(keeper_socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // The CA spoiled in place, its identity (inode, size, time) kept: a command that read it
  // would fail; through the keeper, none does.
  std::string ca_text;
  {
    std::ifstream in(coord_.ca());
    ca_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  struct stat ca_st {};
  ASSERT_EQ(::stat(coord_.ca().c_str(), &ca_st), 0);
  auto overwrite_ca = [&](const std::string& text) {
    int fd = ::open(coord_.ca().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
    timespec times[2] = {ca_st.st_atim, ca_st.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, coord_.ca().c_str(), times, 0), 0);
  };
  overwrite_ca(std::string(ca_text.size(), 'x'));
  o = corral({"submit", "--parsable", "-G", "1", "--", "sh", "-c", "echo through the keeper"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::string id = o.out.substr(0, o.out.find('\n'));
  o = corral({"wait", id, "--timeout", "30"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  o = corral({"logs", id});
  EXPECT_EQ(o.out, "through the keeper\n") << o.err;
  // An unknown job: the coordinator's 404, relayed.
  o = corral({"show", "999999"});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("999999"), std::string::npos) << o.err;
  EXPECT_EQ(keeper_pid(), keeper) << "one keeper served them all";
  // The same command on its own, with no kept session either, reads the spoiled CA.
  auto direct = env();
  direct.insert(direct.end(), {"CORRAL_KEEP_CONNECTION=0", "HOME=", "XDG_CONFIG_HOME="});
  o = testing::run_to_end({CORRAL_CLI_BIN, "queue"}, direct);
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_NE(o.err.find("cannot load CA"), std::string::npos) << o.err;
  overwrite_ca(ca_text);
}

// A keeper ends after CORRAL_KEEP_CONNECTION idle seconds, and at once when the
// coordinator cannot be reached: the command it was relaying fails as a direct one would,
// with the same code and message, and the next goes directly. With no command, it ends
// within seconds of its coordinator's going.
TEST_F(CliClusterTest, AKeeperEndsWhenIdleOrWhenTheCoordinatorIsGoneAndTheCommandSaysWhyAsIfDirect) {
  auto briefly = env();
  briefly.push_back("CORRAL_KEEP_CONNECTION=1");
  auto o = testing::run_to_end({CORRAL_CLI_BIN, "queue"}, briefly);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  pid_t keeper = 0;
  ASSERT_TRUE(eventually([&] { return (keeper = keeper_pid()) > 0; }, 10s));
  EXPECT_TRUE(eventually([&] { return !running(keeper); }, 10s)) << "still there after a second idle";
  EXPECT_EQ(keeper_socket(), "") << "its socket is left";

  o = corral({"queue"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  ASSERT_TRUE(eventually([&] { return (keeper = keeper_pid()) > 0; }, 10s));
  // Killed, it leaves its socket behind: the next command goes directly and starts another.
  ASSERT_EQ(::kill(keeper, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !running(keeper); }, 10s));
  o = corral({"queue"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  pid_t second = 0;
  ASSERT_TRUE(eventually([&] { return (second = keeper_pid()) > 0 && second != keeper; }, 10s));
  keeper = second;
  coord_.kill9();
  auto through = corral({"queue"});
  EXPECT_TRUE(eventually([&] { return !running(keeper); }, 10s)) << "the keeper outlived its coordinator";
  auto direct = corral({"queue"});
  EXPECT_EQ(keeper_pid(), 0) << "a keeper started for a coordinator that did not answer";
  EXPECT_EQ(through.exit_code, direct.exit_code);
  EXPECT_EQ(through.err, direct.err);
  EXPECT_NE(direct.err.find("cannot connect to"), std::string::npos) << direct.err;
  ASSERT_TRUE(coord_.start());

  // A coordinator gone while no command runs: its keeper sees the port refused and ends
  // within seconds, not after its 600 idle ones, removing its socket.
  o = corral({"queue"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  ASSERT_TRUE(eventually([&] { return (keeper = keeper_pid()) > 0; }, 10s));
  coord_.kill9();
  EXPECT_TRUE(eventually([&] { return !running(keeper); }, 10s)) << "the keeper outlived its coordinator";
  EXPECT_EQ(keeper_socket(), "") << "its socket is left";
  ASSERT_TRUE(coord_.start());
}

// Each side sends nothing to a process of another user: a command does not send its token
// to a socket served by someone else (it goes directly), and a keeper answers nobody else.
TEST_F(CliClusterTest, NeitherACommandNorTheKeeperTalksToAnotherUsersProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as another user";
  auto o = corral({"queue"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  pid_t keeper = 0;
  ASSERT_TRUE(eventually([&] { return (keeper = keeper_pid()) > 0; }, 10s));
  const std::string path = keeper_socket();

  // Another user (nobody, 65534) asks the keeper, reaching its socket through folders
  // opened up for it: the keeper closes the connection without an answer.
  ASSERT_EQ(::chmod((runtime_ + "/corral").c_str(), 0711), 0);
  ASSERT_EQ(::chmod(runtime_.c_str(), 0711), 0);
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  int answer_pipe[2];
  ASSERT_EQ(::pipe(answer_pipe), 0);
  std::string request = "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + coord_.token() + "\r\n\r\n";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  pid_t other = ::fork();
  if (other == 0) {
    char got = 'e';
    if (::setresgid(65534, 65534, 65534) == 0 && ::setresuid(65534, 65534, 65534) == 0) {
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        // The keeper may have closed it already: no SIGPIPE for that.
        ssize_t ignored = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
        (void)ignored;
        char buf[64];
        got = ::read(fd, buf, sizeof(buf)) > 0 ? 'a' : '0';  // '0': closed (or reset), no answer
      } else {
        got = 'c';
      }
    }
    ssize_t ignored = ::write(answer_pipe[1], &got, 1);
    (void)ignored;
    ::_exit(0);
  }
  ::close(answer_pipe[1]);
  char got = 0;
  ASSERT_EQ(::read(answer_pipe[0], &got, 1), 1);
  ::close(answer_pipe[0]);
  ::waitpid(other, nullptr, 0);
  EXPECT_EQ(got, '0') << "e: could not become nobody, c: could not connect, a: answered";
  ASSERT_EQ(::chmod((runtime_ + "/corral").c_str(), 0700), 0);
  ASSERT_EQ(::chmod(runtime_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0700), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(running(keeper));

  // The keeper gone, its socket taken over by nobody's process: the command does not send
  // it a byte and goes directly.
  ASSERT_EQ(::kill(keeper, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return !running(keeper); }, 10s));
  int bytes_pipe[2];
  ASSERT_EQ(::pipe(bytes_pipe), 0);
  pid_t impostor = ::fork();
  if (impostor == 0) {
    // Bound as root in the private folder, listening as nobody: SO_PEERCRED names the
    // process that listened.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ::unlink(path.c_str());
    char bytes = 'e';
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::setresgid(65534, 65534, 65534) == 0 &&
        ::setresuid(65534, 65534, 65534) == 0 && ::listen(fd, 8) == 0) {
      if (::write(bytes_pipe[1], "l", 1) != 1) ::_exit(1);
      int c = ::accept(fd, nullptr, nullptr);
      char buf[256];
      bytes = c >= 0 && ::read(c, buf, sizeof(buf)) <= 0 ? '0' : 'r';  // '0': nothing was sent
    }
    ssize_t ignored = ::write(bytes_pipe[1], &bytes, 1);
    (void)ignored;
    ::_exit(0);
  }
  ::close(bytes_pipe[1]);
  char listening = 0;
  ASSERT_EQ(::read(bytes_pipe[0], &listening, 1), 1);
  ASSERT_EQ(listening, 'l');
  o = corral({"queue"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  char bytes = 0;
  ASSERT_EQ(::read(bytes_pipe[0], &bytes, 1), 1);
  ::close(bytes_pipe[0]);
  ::waitpid(impostor, nullptr, 0);
  EXPECT_EQ(bytes, '0') << "r: the command sent its request to another user's process";
}

}  // namespace
}  // namespace corral
