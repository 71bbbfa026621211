// The real corral-coordinator over real TLS on 127.0.0.1, with certificates made by
// `init` and scripted agents that speak the real WebSocket protocol.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>

#include "tests/support/cluster.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/raw_tls.hpp"
#include "tests/support/scripted_agent.hpp"

namespace corral {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testing::CoordinatorProcess;
using testing::ScriptedAgent;

protocol::Hello hello_for(const std::string& node, const std::string& address, int gpus) {
  protocol::Hello h;
  h.node = node;
  h.address = address;
  h.ports = {29500, 29510};
  h.simulated = true;
  h.driver = "550.54.15";
  h.cuda = {12, 4};
  for (int i = 0; i < gpus; ++i) {
    model::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + node + "-" + std::to_string(i);
    g.cls = {"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"};
    g.cuda = {12, 4};
    h.gpus.push_back(g);
  }
  return h;
}

const char* kTwoNodeJob = R"(name: ddp
command: [corral-worker, tcp-check]
resources:
  nodes: 2
  gpus_per_node: 2
)";

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(coord_.init_ok());
    ASSERT_EQ(coord_.token().size(), 64u);
    ASSERT_TRUE(coord_.start());
    coord_.agent_cert("gpu-a");
    certs_ = coord_.agent_cert("gpu-b");
    ASSERT_FALSE(certs_.empty());
    http_ = coord_.client();
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const auto& line : coord_.process().lines()) std::cerr << "coordinator: " << line << "\n";
    }
  }

  net::HttpResponse call(const std::string& method, const std::string& target, const std::string& body = {},
                         std::string token = "") {
    if (token.empty()) token = coord_.token();
    auto r = http_->request(method, target, body, {{"Authorization", "Bearer " + token}});
    EXPECT_TRUE(r.has_value()) << r.error().message();
    return r ? *r : net::HttpResponse{0, "", "", {}};
  }

  model::JobId submit(const std::string& spec, const std::string& token = "") {
    auto r = call("POST", "/v1/jobs", Json{{"spec", spec}, {"file", "job.yaml"}}.dump(), token);
    EXPECT_EQ(r.status, 201) << r.body;
    return r.status == 201 ? Json::parse(r.body)["id"].get<model::JobId>() : 0;
  }

  Json job(model::JobId id) { return Json::parse(call("GET", "/v1/jobs/" + std::to_string(id)).body); }

  // Polls the API until the job is in `state` (agent messages and HTTP requests travel
  // on different connections, so there is no event to wait on in between).
  bool reaches(model::JobId id, const std::string& state, std::chrono::milliseconds timeout = 5s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (job(id)["state"] == state) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  // Both agents join; the 2-node job is prepared on its rank-0 node and launched on both.
  struct Launched {
    protocol::Prepare prepare;
    protocol::Launch on_a;
    protocol::Launch on_b;
  };
  std::optional<Launched> run_two_node_job(ScriptedAgent& a, ScriptedAgent& b, model::JobId& id) {
    id = submit(kTwoNodeJob);
    ScriptedAgent& master = a;
    auto prepare = master.expect<protocol::Prepare>();
    if (!prepare) return std::nullopt;
    master.send(protocol::PrepareResult{prepare->job, prepare->attempt, true, false, "", "", prepare->master_port});
    auto la = a.expect<protocol::Launch>();
    auto lb = b.expect<protocol::Launch>();
    if (!la || !lb) return std::nullopt;
    return Launched{*prepare, *la, *lb};
  }

  // Both agents join; the two-node job launches and all four ranks report started.
  // Both agents connect; the two-node job is launched on them, no rank started yet.
  void launch_on(ScriptedAgent& a, ScriptedAgent& b, model::JobId& id) {
    ASSERT_TRUE(a.connect());
    ASSERT_TRUE(b.connect());
    ASSERT_TRUE(run_two_node_job(a, b, id).has_value());
  }

  void start_ranks(ScriptedAgent& a, ScriptedAgent& b, model::JobId& id) {
    ASSERT_NO_FATAL_FAILURE(launch_on(a, b, id));
    for (int r = 0; r < 4; ++r) (r < 2 ? a : b).send(protocol::RankStarted{id, 0, r, 1000 + r});
  }

  // The two-node job running on both agents' GPUs, and `n` more queued behind it.
  void run_one_queue_more(ScriptedAgent& a, ScriptedAgent& b, model::JobId& running, std::vector<model::JobId>& queued,
                          int n) {
    ASSERT_NO_FATAL_FAILURE(start_ranks(a, b, running));
    ASSERT_TRUE(reaches(running, "RUNNING"));
    for (int i = 0; i < n; ++i) queued.push_back(submit(kTwoNodeJob));
  }

  // A two-node job runs on agents that then lose the coordinator to a SIGKILL; it is
  // restarted, and the agents (gone with their connections) are not back yet.
  void run_then_restart(model::JobId& id) {
    ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
    ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
    ASSERT_NO_FATAL_FAILURE(start_ranks(a, b, id));
    ASSERT_TRUE(reaches(id, "RUNNING"));
    // Committed, not only shown: an agent whose reports were not acknowledged would send
    // them again after the restart, and these do not.
    ASSERT_TRUE(a.all_acked());
    ASSERT_TRUE(b.all_acked());
    ASSERT_NO_FATAL_FAILURE(restart_after_sigkill());
  }

  void restart_after_sigkill() {
    coord_.kill9();
    ASSERT_TRUE(coord_.start());
    http_ = coord_.client();
  }

  testing::TempDir dir_;
  CoordinatorProcess coord_{dir_};
  std::string certs_;
  std::unique_ptr<net::HttpClient> http_;
};

// A rank's start changes only its rank: its record is written with a later batch (paced
// for large gangs), and the report is acknowledged only after that write. Killed right
// after the Acks, the coordinator comes back knowing every acknowledged pid.
TEST_F(CoordinatorTest, AnAcknowledgedRankStartSurvivesASigkillRightAfterItsAck) {
  model::JobId id = 0;
  {
    ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
    ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
    ASSERT_NO_FATAL_FAILURE(launch_on(a, b, id));
    // Three of four: the job stays STARTING, so no whole-record write carries them.
    for (int r = 0; r < 3; ++r) (r < 2 ? a : b).send(protocol::RankStarted{id, 0, r, 1000 + r});
    ASSERT_TRUE(a.all_acked());
    ASSERT_TRUE(b.all_acked());
    ASSERT_NO_FATAL_FAILURE(restart_after_sigkill());
  }
  Json j = job(id);
  EXPECT_EQ(j["state"], "STARTING") << j.dump(2);
  ASSERT_EQ(j["ranks"].size(), 4u) << j.dump(2);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(j["ranks"][r]["pid"], 1000 + r) << j.dump(2);
}

// Rank records are written at most once per twice the last such write's time. Another
// writer holds the database for 600 ms while a rank start is committed, so that write
// takes nearly that long; the next rank start is acknowledged only once its paced write
// is done, over a second later, and it survives a SIGKILL right after.
TEST_F(CoordinatorTest, ARankStartWaitingForItsPacedWriteIsAcknowledgedOnlyOnceWritten) {
  model::JobId id = 0;
  {
    ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
    ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
    ASSERT_NO_FATAL_FAILURE(launch_on(a, b, id));
    ASSERT_TRUE(a.all_acked());
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(coord_.database().c_str(), &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);  // the coordinator may be committing this moment
    ASSERT_EQ(sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    a.send(protocol::RankStarted{id, 0, 0, 1000});
    const auto hold = 600ms;
    std::this_thread::sleep_for(hold);  // what is tested: a write that takes this long
    ASSERT_EQ(sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
    ASSERT_TRUE(a.all_acked());
    const auto first_acked = std::chrono::steady_clock::now();
    a.send(protocol::RankStarted{id, 0, 1, 1001});
    ASSERT_TRUE(a.all_acked(10s * testing::kSanitizerSlowdown));
    const auto waited = std::chrono::steady_clock::now() - first_acked;
    std::cout << "a rank start after a 600 ms hold of the database was acknowledged "
              << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() << " ms after the one before\n";
    // Twice the write's time, which is the hold less the moments the first report took
    // to arrive (up to 350 ms, under a sanitizer on a loaded machine).
    EXPECT_GE(waited, 500ms);
    EXPECT_LT(waited, (2 * hold + 2s) * testing::kSanitizerSlowdown);
    ASSERT_NO_FATAL_FAILURE(restart_after_sigkill());
  }
  Json j = job(id);
  ASSERT_EQ(j["ranks"].size(), 4u) << j.dump(2);
  EXPECT_EQ(j["ranks"][0]["pid"], 1000) << j.dump(2);
  EXPECT_EQ(j["ranks"][1]["pid"], 1001) << j.dump(2);
}

TEST_F(CoordinatorTest, APortFileThatCannotBeWrittenIsAClearErrorNotACrash) {
  // A second coordinator, of a cluster of its own, on its own port (0: any), told to write
  // where it cannot.
  ASSERT_EQ(testing::run({CORRAL_COORDINATOR_BIN, "init", "--state-dir", dir_.file("second")}).first, 0);
  std::string config = dir_.file("second.yaml");
  std::ofstream(config) << "listen: 127.0.0.1:0\nstate_dir: " << dir_.file("second") << "\n";
  testing::Child c;
  ASSERT_TRUE(c.start({CORRAL_COORDINATOR_BIN, "--config", config, "--port-file", "/nonexistent/corral/port"}));
  int status = c.wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  bool said = false;
  for (const auto& line : c.lines()) said = said || line.find("--port-file: cannot write /nonexistent/corral/port") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST_F(CoordinatorTest, ASecondHelloOnOneConnectionIsNotWelcomedAgain) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  ASSERT_TRUE(a.connect());
  a.send(hello_for("gpu-b", "10.0.0.2", 2));
  ASSERT_TRUE(coord_.process().wait_for_line("said hello twice on one connection"));
  // Ignored: no second Welcome (it would have gone out before that line), the link stays up.
  EXPECT_FALSE(a.expect<protocol::Welcome>(std::chrono::milliseconds(0)).has_value());
  EXPECT_FALSE(a.closed().has_value());
}

TEST_F(CoordinatorTest, RunsATwoNodeJobFromSubmitToCompleted) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  ASSERT_TRUE(a.connect());
  ASSERT_TRUE(b.connect());
  model::JobId id = 0;
  auto l = run_two_node_job(a, b, id);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->prepare.master_addr, "10.0.0.1");
  EXPECT_EQ(l->prepare.master_port, 29500);
  // One rendezvous record for both nodes; each gets its own ranks.
  EXPECT_EQ(l->on_a.master_addr, l->on_b.master_addr);
  EXPECT_EQ(l->on_a.master_port, 29500);
  EXPECT_EQ(l->on_a.world_size, 4);
  EXPECT_EQ(l->on_a.nodes, (std::vector<std::string>{"gpu-a", "gpu-b"}));
  ASSERT_EQ(l->on_a.ranks.size(), 2u);
  EXPECT_EQ(l->on_b.ranks[0].rank, 2);
  EXPECT_EQ(l->on_b.ranks[1].gpus, std::vector<int>{1});
  EXPECT_EQ(l->on_a.command.argv, (std::vector<std::string>{"corral-worker", "tcp-check"}));
  for (int r = 0; r < 4; ++r) {
    (r < 2 ? a : b).send(protocol::RankStarted{id, 0, r, 1000 + r});
  }
  EXPECT_TRUE(reaches(id, "RUNNING"));
  for (int r = 0; r < 4; ++r) {
    (r < 2 ? a : b).send(protocol::RankExited{id, 0, r, 0, 0, "exited with code 0", false});
  }
  // Completed, but the GPUs and the port stay held until both agents confirm that nothing
  // of the attempt is left on their node.
  ASSERT_TRUE(reaches(id, "ENDING"));
  Json ending = job(id);
  EXPECT_EQ(ending["outcome"], "COMPLETED");
  EXPECT_EQ(ending["waiting_for"].size(), 4u);
  a.send(protocol::AttemptGone{id, 0});
  ASSERT_TRUE(reaches(id, "ENDING"));
  model::JobId blocked = submit(kTwoNodeJob);  // needs gpu-b's GPUs, not confirmed free yet
  EXPECT_FALSE(b.expect<protocol::Launch>(300ms).has_value());
  EXPECT_FALSE(a.expect<protocol::Prepare>(300ms).has_value());
  b.send(protocol::AttemptGone{id, 0});
  EXPECT_TRUE(reaches(id, "COMPLETED"));
  Json j = job(id);
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["ranks"][3]["state"], "EXITED");
  EXPECT_EQ(j["ranks"][0]["gpu_uuids"][0], "GPU-gpu-a-0");
  EXPECT_EQ(j["ranks"][3]["gone"], true);
  EXPECT_GE(j["events"].size(), 4u);
  // The GPUs and the port are free again: the waiting job lands on the same port.
  auto p2 = a.expect<protocol::Prepare>();
  ASSERT_TRUE(p2.has_value());
  EXPECT_EQ(p2->job, blocked);
  EXPECT_EQ(p2->master_port, 29500);
}

TEST_F(CoordinatorTest, AFailingRankTearsTheGangDownEverywhere) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  model::JobId id = 0;
  ASSERT_NO_FATAL_FAILURE(start_ranks(a, b, id));
  b.send(protocol::RankExited{id, 0, 3, 7, 0, "exited with code 7", false});
  auto ka = a.expect<protocol::Kill>();
  auto kb = b.expect<protocol::Kill>();
  ASSERT_TRUE(ka && kb);
  EXPECT_EQ(ka->job, id);
  EXPECT_EQ(ka->grace_ms, 1000);
  Json j = job(id);
  EXPECT_EQ(j["state"], "ENDING");
  EXPECT_EQ(j["outcome"], "FAILED");
  // The killed ranks report, then each agent confirms its node is clean.
  for (int r = 0; r < 3; ++r) (r < 2 ? a : b).send(protocol::RankExited{id, 0, r, 0, 15, "killed by signal 15", false});
  a.send(protocol::AttemptGone{id, 0});
  b.send(protocol::AttemptGone{id, 0});
  ASSERT_TRUE(reaches(id, "FAILED"));
  j = job(id);
  EXPECT_EQ(j["ranks"][0]["state"], "KILLED");
  EXPECT_EQ(j["failed_rank"], 3);
  EXPECT_EQ(j["failed_node"], "gpu-b");
  EXPECT_EQ(j["exit_code"], 7);
}

TEST_F(CoordinatorTest, ASilentNodeIsDownAndItsJobNodeFail) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  model::JobId id = 0;
  ASSERT_NO_FATAL_FAILURE(start_ranks(a, b, id));
  b.heartbeats = false;  // gpu-b goes silent but keeps its connection
  auto started = std::chrono::steady_clock::now();
  auto kill = a.expect<protocol::Kill>(5s);
  ASSERT_TRUE(kill.has_value());
  auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, CoordinatorProcess::kNodeLostTimeout + 1s);  // node_lost_timeout plus a second
  Json j = job(id);
  EXPECT_EQ(j["state"], "ENDING");
  EXPECT_EQ(j["outcome"], "NODE_FAIL");
  EXPECT_EQ(j["waiting_for"].size(), 2u);  // gpu-a's ranks; gpu-b's are fenced
  EXPECT_EQ(j["waiting_for"][0]["node"], "gpu-a");
  Json nodes = Json::parse(call("GET", "/v1/nodes").body);
  EXPECT_EQ(nodes[1]["name"], "gpu-b");
  EXPECT_EQ(nodes[1]["state"], "down");
  // gpu-a confirms: the job ends. gpu-b's ranks are LOST and not confirmed dead: its GPUs
  // and the master port on gpu-a (those ranks may still connect to it) stay fenced until
  // its agent comes back or an admin clears the node.
  a.send(protocol::AttemptGone{id, 0});
  ASSERT_TRUE(reaches(id, "NODE_FAIL"));
  j = job(id);
  EXPECT_EQ(j["ranks"][2]["state"], "LOST");
  ASSERT_EQ(j["fences"].size(), 1u);
  EXPECT_EQ(j["fences"][0]["node"], "gpu-b");
  EXPECT_EQ(j["fences"][0]["port"], 29500);
  EXPECT_EQ(j["fences"][0]["host"], "10.0.0.1");
  // The listing a line per node counts the fenced GPUs as held, gpu-a's as free.
  Json by_class = Json::parse(call("GET", "/v1/nodes?gpus=classes").body);
  ASSERT_EQ(by_class.size(), 2u);
  EXPECT_EQ(by_class[0]["gpu_classes"][0]["count"], 2);
  EXPECT_EQ(by_class[0]["gpu_classes"][0]["used"], 0);
  EXPECT_EQ(by_class[1]["gpu_classes"][0]["used"], 2);
  auto bad = call("GET", "/v1/nodes?gpus=some");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("gpus: must be each"), std::string::npos) << bad.body;
  b.disconnect();
  auto refused = call("POST", "/v1/nodes/gpu-a/clear");
  EXPECT_EQ(refused.status, 409) << refused.body;  // its agent is there to confirm itself
  auto cleared = call("POST", "/v1/nodes/gpu-b/clear");
  ASSERT_EQ(cleared.status, 200) << cleared.body;
  EXPECT_EQ(Json::parse(cleared.body)["cleared"][0]["id"], id);
  EXPECT_TRUE(job(id)["fences"].empty());
  bool audited = false;
  Json ended = job(id);  // a local: ranging over a member of a temporary would dangle
  for (const auto& e : ended["events"]) {
    audited = audited || e["text"].get<std::string>().find("declared dead by admin tester") != std::string::npos;
  }
  EXPECT_TRUE(audited) << ended["events"].dump(1);
}

TEST_F(CoordinatorTest, RestartAfterSigkillKeepsRunningJobsAndEveryAcknowledgedSubmit) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  model::JobId id = 0;
  std::vector<model::JobId> queued;
  ASSERT_NO_FATAL_FAILURE(run_one_queue_more(a, b, id, queued, 20));
  ASSERT_NO_FATAL_FAILURE(restart_after_sigkill());
  // Agents come back and report what still runs.
  auto ha = hello_for("gpu-a", "10.0.0.1", 2);
  ha.running = {{id, 0, 0, 1000}, {id, 0, 1, 1001}};
  auto hb = hello_for("gpu-b", "10.0.0.2", 2);
  hb.running = {{id, 0, 2, 1002}, {id, 0, 3, 1003}};
  ScriptedAgent a2(coord_.url(), certs_, ha);
  ScriptedAgent b2(coord_.url(), certs_, hb);
  ASSERT_TRUE(a2.connect());
  ASSERT_TRUE(b2.connect());
  auto keep = a2.expect<protocol::Reconcile>();
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->keep, (std::vector<std::pair<model::JobId, int>>{{id, 0}}));
  EXPECT_EQ(job(id)["state"], "RUNNING");
  for (model::JobId q : queued) EXPECT_EQ(job(q)["state"], "PENDING") << q;
  for (int r = 0; r < 4; ++r) (r < 2 ? a2 : b2).send(protocol::RankExited{id, 0, r, 0, 0, "exited with code 0", false});
  a2.send(protocol::AttemptGone{id, 0});
  b2.send(protocol::AttemptGone{id, 0});
  // The next job goes to the freed GPUs once this one completes.
  auto next = a2.expect<protocol::Prepare>();
  ASSERT_TRUE(next.has_value());
  EXPECT_TRUE(reaches(id, "COMPLETED"));
}

// A submission whose answer was lost is sent again with its Idempotency-Key: the
// coordinator answers with the job it made, also after a SIGKILL right after the 201.
TEST_F(CoordinatorTest, ASubmitRetriedWithItsKeyMakesOneJobAcrossASigkillAndKeysAreEachUsers) {
  std::string bob = coord_.add_user("bob");
  ASSERT_EQ(bob.size(), 64u);
  auto keyed = [&](const std::string& key, const std::string& token) {
    auto r = http_->request("POST", "/v1/jobs", Json{{"spec", kTwoNodeJob}, {"file", "job.yaml"}}.dump(),
                            {{"Authorization", "Bearer " + token}, {"Idempotency-Key", key}});
    EXPECT_TRUE(r.has_value()) << r.error().message();
    return r ? *r : net::HttpResponse{0, "", "", {}};
  };
  auto count_jobs = [&] { return Json::parse(call("GET", "/v1/jobs?all=1").body).size(); };
  const std::string key = "0123456789abcdef0123456789abcdef";
  auto first = keyed(key, coord_.token());
  ASSERT_EQ(first.status, 201) << first.body;
  const auto id = Json::parse(first.body)["id"].get<model::JobId>();
  auto again = keyed(key, coord_.token());
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(Json::parse(again.body)["id"], id);
  EXPECT_EQ(Json::parse(again.body)["repeated"], true);
  EXPECT_EQ(count_jobs(), 1u);

  // Bob's same key is his own: a new job, and nothing of the other's.
  auto bobs = keyed(key, bob);
  ASSERT_EQ(bobs.status, 201) << bobs.body;
  const auto bobs_id = Json::parse(bobs.body)["id"].get<model::JobId>();
  EXPECT_NE(bobs_id, id);
  EXPECT_FALSE(Json::parse(bobs.body).contains("repeated"));
  EXPECT_EQ(job(bobs_id)["user"], "bob");

  auto bad = keyed(std::string(200, 'k'), coord_.token());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("Idempotency-Key"), std::string::npos) << bad.body;
  EXPECT_EQ(count_jobs(), 2u);

  // A new key's job, then the coordinator killed right after its 201.
  auto last = keyed("fedcba9876543210", coord_.token());
  ASSERT_EQ(last.status, 201) << last.body;
  const auto last_id = Json::parse(last.body)["id"].get<model::JobId>();
  ASSERT_NO_FATAL_FAILURE(restart_after_sigkill());
  auto retried = keyed("fedcba9876543210", coord_.token());
  ASSERT_EQ(retried.status, 201) << retried.body;
  EXPECT_EQ(Json::parse(retried.body)["id"], last_id);
  EXPECT_EQ(Json::parse(retried.body)["repeated"], true);
  EXPECT_EQ(Json::parse(keyed(key, bob).body)["id"], bobs_id);
  EXPECT_EQ(count_jobs(), 3u);
}

TEST_F(CoordinatorTest, AJobWhoseRanksAreGoneAfterARestartIsNodeFail) {
  model::JobId id = 0;
  ASSERT_NO_FATAL_FAILURE(run_then_restart(id));
  auto ha = hello_for("gpu-a", "10.0.0.1", 2);
  ha.running = {{id, 0, 0, 1000}, {id, 0, 1, 1001}};
  ScriptedAgent a2(coord_.url(), certs_, ha);
  ScriptedAgent b2(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));  // its ranks are gone
  ASSERT_TRUE(a2.connect());
  ASSERT_TRUE(b2.connect());
  auto kill = a2.expect<protocol::Kill>();
  ASSERT_TRUE(kill.has_value());
  ASSERT_TRUE(reaches(id, "ENDING"));
  EXPECT_EQ(job(id)["outcome"], "NODE_FAIL");
  a2.send(protocol::AttemptGone{id, 0});
  b2.send(protocol::AttemptGone{id, 0});
  EXPECT_TRUE(reaches(id, "NODE_FAIL"));
}

// A job that ended while the coordinator was down: its agents hold back the exit reports
// and send them after the next hello. They are applied before anything is judged lost.
TEST_F(CoordinatorTest, AJobThatEndedWhileTheCoordinatorWasDownIsCompletedNotLost) {
  model::JobId id = 0;
  ASSERT_NO_FATAL_FAILURE(run_then_restart(id));
  // Both agents come back with no rank running: all four exited 0 meanwhile.
  ScriptedAgent a2(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b2(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  a2.sync_on_welcome = false;
  b2.sync_on_welcome = false;
  ASSERT_TRUE(a2.connect());
  ASSERT_TRUE(b2.connect());
  // gpu-a's reports and Synced first: gpu-b has not synced, nothing is judged there.
  for (int r = 0; r < 2; ++r) a2.send(protocol::RankExited{id, 0, r, 0, 0, "exited with code 0", false});
  a2.send(protocol::AttemptGone{id, 0});
  a2.send(protocol::Synced{});
  ASSERT_TRUE(a2.expect<protocol::Reconcile>().has_value());
  EXPECT_EQ(job(id)["state"], "RUNNING");
  for (int r = 2; r < 4; ++r) b2.send(protocol::RankExited{id, 0, r, 0, 0, "exited with code 0", false});
  b2.send(protocol::AttemptGone{id, 0});
  b2.send(protocol::Synced{});
  EXPECT_TRUE(reaches(id, "COMPLETED"));
  Json j = job(id);
  EXPECT_EQ(j["attempt"], 0);
  EXPECT_EQ(j["exit_code"], 0);
  for (const auto& e : j["events"]) EXPECT_EQ(e["text"].get<std::string>().find("PENDING (attempt"), std::string::npos) << e;
}

TEST_F(CoordinatorTest, NoJobIsPlacedOnANodeWhoseAgentIsDisconnected) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  ASSERT_TRUE(a.connect());
  ASSERT_TRUE(b.connect());
  b.disconnect();  // within node_lost_timeout: the node is not down yet, but unreachable
  model::JobId id = submit(kTwoNodeJob);
  EXPECT_FALSE(a.expect<protocol::Prepare>(500ms).has_value());
  Json j = job(id);
  EXPECT_EQ(j["state"], "PENDING");
  EXPECT_EQ(j["reason"], "NodeDown");
  EXPECT_NE(j["detail"].get<std::string>().find("gpu-b"), std::string::npos) << j["detail"];
}

TEST_F(CoordinatorTest, ABusyPortIsSkippedWithoutTheUserNoticing) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  ASSERT_TRUE(a.connect());
  ASSERT_TRUE(b.connect());
  model::JobId id = submit(kTwoNodeJob);
  auto p1 = a.expect<protocol::Prepare>();
  ASSERT_TRUE(p1.has_value());
  a.send(protocol::PrepareResult{id, 0, false, true, "", "bind: Address already in use", p1->master_port});
  // The same answer again (sent again after a reconnect) is about a port the job left.
  a.send(protocol::PrepareResult{id, 0, false, true, "", "bind: Address already in use", p1->master_port});
  auto p2 = a.expect<protocol::Prepare>();
  ASSERT_TRUE(p2.has_value());
  EXPECT_EQ(p2->master_port, 29501);
  EXPECT_EQ(p2->attempt, 0);
}

TEST_F(CoordinatorTest, TokensAndOwnershipAreEnforced) {
  auto none = http_->request("GET", "/v1/jobs");
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(Json::parse(none->body)["error"], "missing bearer token (Authorization: Bearer TOKEN)");
  EXPECT_EQ(call("GET", "/v1/jobs", "", std::string(64, 'f')).status, 401);
  std::string bob = coord_.add_user("bob");
  ASSERT_EQ(bob.size(), 64u);
  EXPECT_EQ(call("GET", "/v1/jobs", "", bob).status, 200);
  model::JobId mine = submit(kTwoNodeJob);  // tester's (admin) job
  auto r = call("POST", "/v1/jobs/" + std::to_string(mine) + "/cancel", "", bob);
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(call("GET", "/v1/jobs/" + std::to_string(mine) + "/logs", "", bob).status, 403);
  EXPECT_EQ(call("POST", "/v1/nodes/gpu-a/drain", R"({"reason":"x"})", bob).status, 403);
  model::JobId bobs = submit(kTwoNodeJob, bob);
  EXPECT_EQ(job(bobs)["user"], "bob");
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(bobs) + "/cancel", "", bob).status, 200);
  EXPECT_EQ(job(bobs)["state"], "CANCELLED");
  EXPECT_EQ(call("POST", "/v1/jobs/" + std::to_string(bobs) + "/cancel", "", bob).status, 409);
  // A replaced token stops working without a restart (within the coordinator's recheck).
  std::string bob2 = coord_.add_user("bob");
  ASSERT_EQ(bob2.size(), 64u);
  EXPECT_EQ(call("GET", "/v1/whoami", "", bob2).status, 200);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (call("GET", "/v1/whoami", "", bob).status != 401 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(call("GET", "/v1/whoami", "", bob).status, 401);
}

TEST_F(CoordinatorTest, ListsFilterByUsersAndStatesAndBulkCancelAnswersEachJob) {
  std::string bob = coord_.add_user("bob");
  std::string carol = coord_.add_user("carol");
  model::JobId t1 = submit(kTwoNodeJob);
  model::JobId b1 = submit(kTwoNodeJob, bob);
  model::JobId b2 = submit(kTwoNodeJob, bob);
  model::JobId c1 = submit(kTwoNodeJob, carol);
  auto ids = [&](const std::string& target, const std::string& token = "") {
    auto r = call("GET", target, "", token);
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<model::JobId> out;
    for (const auto& j : Json::parse(r.body)) out.push_back(j["id"]);
    return out;
  };
  EXPECT_EQ(ids("/v1/jobs?user=bob,carol"), (std::vector<model::JobId>{b1, b2, c1}));
  EXPECT_EQ(ids("/v1/jobs?me=1", bob), (std::vector<model::JobId>{b1, b2}));
  EXPECT_EQ(ids("/v1/jobs?state=pd&user=tester"), (std::vector<model::JobId>{t1}));
  auto bad = call("GET", "/v1/jobs?state=PENDING,SLEEPING");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(Json::parse(bad.body)["error"].get<std::string>().find("state: \"SLEEPING\" is not a job state"),
            std::string::npos) << bad.body;

  // By id: each job on its own; someone else's is refused, and the rest are cancelled.
  auto r = call("POST", "/v1/jobs/cancel", Json{{"ids", {b1, c1, 999}}}.dump(), bob);
  ASSERT_EQ(r.status, 200) << r.body;
  Json answer = Json::parse(r.body);
  ASSERT_EQ(answer["cancelled"].size(), 1u);
  EXPECT_EQ(answer["cancelled"][0]["id"], b1);
  ASSERT_EQ(answer["failed"].size(), 2u);
  EXPECT_EQ(answer["failed"][0]["status"], 403);
  EXPECT_EQ(answer["failed"][1]["status"], 404);
  EXPECT_EQ(job(c1)["state"], "PENDING");
  // By filter: a user may not name another's jobs; an admin may.
  EXPECT_EQ(call("POST", "/v1/jobs/cancel", R"({"user": ["carol"]})", bob).status, 403);
  EXPECT_EQ(call("POST", "/v1/jobs/cancel", R"({"ids": [1], "user": ["bob"]})", bob).status, 400);
  EXPECT_EQ(call("POST", "/v1/jobs/cancel", R"({})", bob).status, 400);
  EXPECT_EQ(call("POST", "/v1/jobs/cancel", R"({"ids": ["seven"]})", bob).status, 400);
  r = call("POST", "/v1/jobs/cancel", R"({"user": ["bob", "carol"], "state": ["PENDING"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Json::parse(r.body)["cancelled"].size(), 2u);  // b2 and c1
  EXPECT_EQ(ids("/v1/jobs"), (std::vector<model::JobId>{t1}));
  EXPECT_EQ(ids("/v1/jobs?state=CANCELLED"), (std::vector<model::JobId>{b1, b2, c1}));
}

TEST_F(CoordinatorTest, AnAgentCertificateFromAnotherCaIsRefused) {
  testing::TempDir other;
  testing::CoordinatorProcess foreign(other);
  std::string rogue = foreign.agent_cert("gpu-a");
  // The rogue agent trusts our server (so the handshake reaches the client certificate).
  std::filesystem::copy_file(coord_.ca(), rogue + "/ca.pem", std::filesystem::copy_options::overwrite_existing);
  ScriptedAgent agent(coord_.url(), rogue, hello_for("gpu-a", "10.0.0.1", 2));
  EXPECT_FALSE(agent.connect(3s));
  EXPECT_TRUE(agent.closed().has_value());
  EXPECT_EQ(Json::parse(call("GET", "/v1/nodes").body).size(), 0u);
}

TEST_F(CoordinatorTest, AnAgentCannotSpeakForAnotherNode) {
  auto hello = hello_for("gpu-b", "10.0.0.2", 2);
  ScriptedAgent liar(coord_.url(), certs_, hello);
  // Its certificate says gpu-a; its hello says gpu-b.
  std::filesystem::copy_file(certs_ + "/gpu-a.pem", certs_ + "/gpu-b.pem", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(certs_ + "/gpu-a.key", certs_ + "/gpu-b.key", std::filesystem::copy_options::overwrite_existing);
  EXPECT_FALSE(liar.connect(3s));
  EXPECT_EQ(Json::parse(call("GET", "/v1/nodes").body).size(), 0u);
}

TEST_F(CoordinatorTest, BadRequestsChangeNothingAndTheDaemonKeepsServing) {
  EXPECT_EQ(call("POST", "/v1/jobs", "{not json").status, 400);
  EXPECT_EQ(call("POST", "/v1/jobs", R"({"spec": 5})").status, 400);
  auto bad_spec = call("POST", "/v1/jobs", Json{{"spec", "name: x\ncommand: true\nresources: {gpus_per_node: four}\n"}}.dump());
  EXPECT_EQ(bad_spec.status, 400);
  EXPECT_FALSE(Json::parse(bad_spec.body)["problems"].empty());
  EXPECT_EQ(call("POST", "/v1/jobs", std::string(2 * 1024 * 1024, 'x')).status, 413);
  EXPECT_EQ(call("GET", "/v1/jobs/abc").status, 400);
  EXPECT_EQ(call("GET", "/v1/jobs/999").status, 404);
  EXPECT_EQ(call("DELETE", "/v1/jobs").status, 405);
  // A malformed agent message is dropped; the agent stays connected and usable.
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ASSERT_TRUE(a.connect());
  EXPECT_EQ(Json::parse(call("GET", "/v1/jobs?all=1").body).size(), 0u);
  auto ok = call("GET", "/v1/whoami");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(Json::parse(ok.body)["user"], "tester");
}

TEST_F(CoordinatorTest, AJobNoNodeCouldRunIsRefusedAtSubmit) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  ASSERT_TRUE(a.connect());
  ASSERT_TRUE(b.connect());
  auto r = call("POST", "/v1/jobs", Json{{"spec", "name: big\ncommand: true\nresources: {gpus_per_node: 16}\n"}}.dump());
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(Json::parse(call("GET", "/v1/jobs?all=1").body).size(), 0u);
  // One GPU taken on each node: two are free, but not two on one node.
  submit("name: spread\ncommand: true\nresources: {nodes: 2, gpus_per_node: 1}\n");
  ASSERT_TRUE(a.expect<protocol::Prepare>().has_value());
  auto dry = call("POST", "/v1/jobs",
                  Json{{"spec", "name: pair\ncommand: true\nresources: {gpus_per_node: 2}\n"}, {"dry_run", true}}.dump());
  ASSERT_EQ(dry.status, 200) << dry.body;
  Json d = Json::parse(dry.body);
  EXPECT_EQ(d["would_start"], false);
  EXPECT_EQ(d["reason"], "NoHomogeneousSet");
  EXPECT_EQ(d["detail"], "no homogeneous set of 2 GPUs: largest free set is 2 × NVIDIA A100-SXM4-80GB on gpu-a, gpu-b")
      << d.dump();
  EXPECT_EQ(Json::parse(call("GET", "/v1/jobs?all=1").body).size(), 1u);  // a dry run stores nothing
}

// ---------------------------------------------------------------- the status page

TEST_F(CoordinatorTest, TheStatusPageAndItsDataAreServedWithoutATokenByDefault) {
  auto page = http_->request("GET", "/");
  ASSERT_TRUE(page.has_value());
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script src=\"/status.js\""), std::string::npos);
  auto csp = std::find_if(page->headers.begin(), page->headers.end(),
                          [](const auto& h) { return h.first == "Content-Security-Policy"; });
  ASSERT_NE(csp, page->headers.end());
  EXPECT_NE(csp->second.find("script-src 'self'"), std::string::npos);
  auto script = http_->request("GET", "/status.js");
  ASSERT_TRUE(script.has_value());
  EXPECT_EQ(script->status, 200);
  EXPECT_NE(script->body.find("/v1/status/events"), std::string::npos);

  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-b", "10.0.0.2", 2));
  model::JobId first = 0;
  std::vector<model::JobId> waiting;
  ASSERT_NO_FATAL_FAILURE(run_one_queue_more(a, b, first, waiting, 3));
  ASSERT_TRUE(call("POST", "/v1/nodes/gpu-b/drain", R"({"reason":"fan replacement"})").status == 200);

  auto r = http_->request("GET", "/v1/status");  // no token
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->status, 200) << r->body;
  Json st = Json::parse(r->body);
  EXPECT_EQ(st["public"], true);
  ASSERT_EQ(st["classes"].size(), 1u);
  EXPECT_EQ(st["classes"][0]["product"], "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(st["classes"][0]["total"], 4);
  EXPECT_EQ(st["classes"][0]["allocated"], 4);
  EXPECT_EQ(st["classes"][0]["free"], 0);
  EXPECT_EQ(st["nodes_by_state"]["drained"], 1) << st["nodes_by_state"].dump();
  ASSERT_EQ(st["nodes"].size(), 2u);
  EXPECT_EQ(st["nodes"][1]["name"], "gpu-b");
  EXPECT_EQ(st["nodes"][1]["reason"], "fan replacement");
  EXPECT_EQ(st["nodes"][1]["gpus"][0]["job"], first);
  EXPECT_EQ(st["holders"][std::to_string(first)]["name"], "ddp");
  EXPECT_EQ(st["holders"][std::to_string(first)]["user"], "tester");
  // Running first, then pending in order.
  EXPECT_EQ(st["queue"]["total"], 4);
  ASSERT_EQ(st["queue"]["rows"].size(), 4u);
  EXPECT_EQ(st["queue"]["rows"][0]["id"], first);
  EXPECT_EQ(st["queue"]["rows"][0]["state"], "RUNNING");
  EXPECT_EQ(st["queue"]["rows"][1]["id"], waiting[0]);
  EXPECT_EQ(st["queue"]["rows"][1]["state"], "PENDING");
  EXPECT_FALSE(st["queue"]["rows"][1]["reason"].get<std::string>().empty());

  // Paged: rows 2 and 3 of 4.
  Json paged = Json::parse(http_->request("GET", "/v1/status?offset=2&limit=2")->body);
  EXPECT_EQ(paged["queue"]["total"], 4);
  ASSERT_EQ(paged["queue"]["rows"].size(), 2u);
  EXPECT_EQ(paged["queue"]["rows"][0]["id"], waiting[1]);
  EXPECT_EQ(paged["queue"]["rows"][1]["id"], waiting[2]);
  EXPECT_EQ(Json::parse(http_->request("GET", "/v1/status?offset=9")->body)["queue"]["rows"].size(), 0u);
  for (const auto& [query, field] : std::vector<std::pair<std::string, std::string>>{
           {"limit=0", "limit"}, {"limit=1001", "limit"}, {"limit=x", "limit"}, {"offset=-1", "offset"}}) {
    auto bad = http_->request("GET", "/v1/status?" + query);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->status, 400) << query;
    EXPECT_TRUE(Json::parse(bad->body)["error"].get<std::string>().starts_with(field + ":")) << bad->body;
  }
}

TEST_F(CoordinatorTest, TheLiveFeedSaysWhenTheClusterChanged) {
  testing::RawTls feed(coord_.port());
  ASSERT_TRUE(feed.ok());
  ASSERT_TRUE(feed.write("GET /v1/status/events HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(feed.read_until("retry: 2000\n\n", 5s)) << feed.received();
  ASSERT_TRUE(feed.read_until("event: change\ndata: {\"ended\":0,\"seq\":", 5s)) << feed.received();
  EXPECT_NE(feed.received().find("Content-Type: text/event-stream"), std::string::npos);
  std::size_t seen = feed.received().size();
  // A job's submission changes the queue: one event follows, with a later number.
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ASSERT_TRUE(a.connect());
  ASSERT_TRUE(feed.read_until("event: change\n", 5s, seen)) << "no event for an agent joining";
  seen = feed.received().size();
  submit("name: one\ncommand: true\nresources: {gpus_per_node: 2}\n");
  ASSERT_TRUE(feed.read_until("event: change\n", 5s, seen)) << "no event for a submit";
  ASSERT_TRUE(a.expect<protocol::Prepare>().has_value());
  // One that must wait (no pass runs for it) is a change too.
  seen = feed.received().size();
  model::JobId id = submit("name: two\ncommand: true\nresources: {gpus_per_node: 2}\n");
  ASSERT_TRUE(feed.read_until("event: change\n", 5s, seen)) << "no event for a job that waits";
  ASSERT_TRUE(reaches(id, "PENDING"));
  // Cancelling the waiting one ends it: the event counts the ended job.
  seen = feed.received().size();
  ASSERT_EQ(call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel").status, 200);
  ASSERT_TRUE(feed.read_until("\"ended\":1,", 10s, seen)) << feed.received().substr(seen);
  EXPECT_FALSE(feed.ended());
}

TEST_F(CoordinatorTest, APrivateStatusPageAsksForATokenForItsDataButServesItsPage) {
  testing::TempDir dir;
  CoordinatorProcess priv(dir, "public_status: false\n");
  ASSERT_TRUE(priv.init_ok());
  ASSERT_TRUE(priv.start());
  auto http = priv.client();
  EXPECT_EQ(http->request("GET", "/")->status, 200);
  EXPECT_EQ(http->request("GET", "/status.js")->status, 200);
  for (const char* path : {"/v1/status", "/v1/status/events", "/metrics"}) {
    auto r = http->request("GET", path);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 401) << path;
  }
  auto with = http->request("GET", "/v1/status", "", {{"Authorization", "Bearer " + priv.token()}});
  ASSERT_TRUE(with.has_value());
  EXPECT_EQ(with->status, 200);
  EXPECT_EQ(Json::parse(with->body)["public"], false);
  testing::RawTls feed(priv.port());
  ASSERT_TRUE(feed.write("GET /v1/status/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + priv.token() +
                         "\r\n\r\n"));
  EXPECT_TRUE(feed.read_until("event: change\n", 5s)) << feed.received();
}

// On a private page the live feed is as good as the token that opened it: once
// `add-user` replaces that token the coordinator ends the stream (within its recheck);
// a feed opened with another user's token goes on.
TEST_F(CoordinatorTest, APrivatePagesLiveFeedEndsWhenItsTokenIsReplaced) {
  testing::TempDir dir;
  CoordinatorProcess priv(dir, "public_status: false\n");
  ASSERT_TRUE(priv.init_ok());
  ASSERT_TRUE(priv.start());
  std::string bob = priv.add_user("bob");
  ASSERT_EQ(bob.size(), 64u);
  auto open_feed = [&](testing::RawTls& feed, const std::string& token) {
    ASSERT_TRUE(feed.write("GET /v1/status/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
                           "\r\n\r\n"));
    ASSERT_TRUE(feed.read_until("event: change\n", 5s)) << feed.received();
  };
  testing::RawTls bobs(priv.port());
  testing::RawTls admins(priv.port());
  ASSERT_NO_FATAL_FAILURE(open_feed(bobs, bob));
  ASSERT_NO_FATAL_FAILURE(open_feed(admins, priv.token()));
  ASSERT_EQ(priv.add_user("bob").size(), 64u);
  EXPECT_TRUE(bobs.closed_within(15s)) << bobs.received();
  EXPECT_FALSE(admins.ended());
  auto http = priv.client();
  auto still = http->request("GET", "/v1/status", "", {{"Authorization", "Bearer " + priv.token()}});
  ASSERT_TRUE(still.has_value());
  EXPECT_EQ(still->status, 200);
  EXPECT_FALSE(admins.closed_within(100ms));
}

TEST_F(CoordinatorTest, AJobsSpecIsShownToItsOwnerAndAdminsOnly) {
  ScriptedAgent a(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ASSERT_TRUE(a.connect());
  std::string bob = coord_.add_user("bob");
  std::string carol = coord_.add_user("carol");
  const std::string spec = "name: bobs\ncommand: [python3, train.py]\nenv: {SECRET_DIR: /data/bob}\nresources: {gpus_per_node: 1}\n";
  model::JobId id = submit(spec, bob);
  auto as = [&](const std::string& token) {
    return Json::parse(call("GET", "/v1/jobs/" + std::to_string(id), "", token).body);
  };
  EXPECT_EQ(as(bob)["spec"], spec);
  EXPECT_EQ(as(coord_.token())["spec"], spec);  // an admin
  Json other = as(carol);
  EXPECT_EQ(other["name"], "bobs");
  EXPECT_FALSE(other.contains("spec")) << other.dump();
}

// ---- a cluster knows itself

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Moves the database and its WAL files out of the way (to `to` + the same suffixes).
void move_database(const std::string& db, const std::string& to) {
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    std::filesystem::rename(db + suffix, to + suffix, ec);
  }
}

// The coordinator did not start: its exit status and what it said.
std::pair<int, std::string> refused(CoordinatorProcess& coord) {
  int status = coord.process().wait();
  std::string said;
  for (const auto& line : coord.process().lines()) said += line + "\n";
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), said};
}

TEST_F(CoordinatorTest, AMissingEmptyOrForeignDatabaseIsRefusedAtStartNeverTakenForANewCluster) {
  model::JobId id = submit(kTwoNodeJob);
  ASSERT_GT(id, 0);
  coord_.stop();
  const std::string db = coord_.database();
  const std::string saved = dir_.file("saved.db");
  move_database(db, saved);

  EXPECT_FALSE(coord_.start());
  auto [missing_rc, missing] = refused(coord_);
  EXPECT_EQ(missing_rc, 3);
  EXPECT_NE(missing.find("the database " + db + " is missing"), std::string::npos) << missing;
  EXPECT_NE(missing.find("cluster-id says cluster"), std::string::npos) << missing;
  EXPECT_NE(missing.find("corral-coordinator new-database"), std::string::npos) << missing;
  EXPECT_FALSE(std::filesystem::exists(db)) << "a refused start made a new database";

  // add-user would have made a new database of one user, which the next start took for the cluster.
  auto [user_rc, token] = testing::run({CORRAL_COORDINATOR_BIN, "add-user", "--state-dir", dir_.file("state"), "eve"});
  EXPECT_NE(user_rc, 0);
  EXPECT_TRUE(token.empty());
  EXPECT_FALSE(std::filesystem::exists(db));

  std::ofstream(db).close();  // truncated to 0 bytes
  EXPECT_FALSE(coord_.start());
  auto [empty_rc, empty] = refused(coord_);
  EXPECT_EQ(empty_rc, 3);
  EXPECT_NE(empty.find("is empty (0 bytes)"), std::string::npos) << empty;

  // Another cluster's database, with its own identity.
  testing::TempDir other_dir;
  CoordinatorProcess other(other_dir);
  ASSERT_TRUE(other.init_ok());
  std::filesystem::copy_file(other.database(), db, std::filesystem::copy_options::overwrite_existing);
  EXPECT_FALSE(coord_.start());
  auto [foreign_rc, foreign] = refused(coord_);
  EXPECT_EQ(foreign_rc, 3);
  const std::string other_id = read_all(other_dir.file("state") + "/cluster-id");
  ASSERT_FALSE(other_id.empty());
  EXPECT_NE(foreign.find("belongs to cluster " + other_id.substr(0, other_id.size() - 1)), std::string::npos)
      << foreign;

  // The cluster's own database back: it starts, with its jobs and tokens.
  std::filesystem::remove(db);
  move_database(saved, db);
  ASSERT_TRUE(coord_.start());
  http_ = coord_.client();
  EXPECT_EQ(job(id)["id"], id);
}

TEST_F(CoordinatorTest, NewDatabaseStartsANewClusterOnlyWhereTheOldDatabaseIsGone) {
  coord_.stop();
  const std::string state = dir_.file("state");
  const std::string old_id = read_all(state + "/cluster-id");
  // Refused while the database holds the cluster.
  auto refused_newdb = testing::run_to_end({CORRAL_COORDINATOR_BIN, "new-database", "--state-dir", state});
  EXPECT_NE(refused_newdb.exit_code, 0);
  EXPECT_NE(refused_newdb.err.find("move that one away first"), std::string::npos) << refused_newdb.err;
  EXPECT_EQ(read_all(state + "/cluster-id"), old_id);

  move_database(coord_.database(), dir_.file("old.db"));
  auto made = testing::run_to_end({CORRAL_COORDINATOR_BIN, "new-database", "--state-dir", state, "--admin", "root2"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string token = made.out.substr(0, made.out.find('\n'));
  EXPECT_EQ(token.size(), 64u);
  const std::string new_id = read_all(state + "/cluster-id");
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(read_all(state + "/cluster-id.previous"), old_id);
  ASSERT_TRUE(coord_.start());
  http_ = coord_.client();
  EXPECT_EQ(call("GET", "/v1/jobs").status, 401) << "the old cluster's tokens are gone with its database";
  EXPECT_EQ(call("GET", "/v1/jobs", "", token).body, "[]");
}

TEST_F(CoordinatorTest, AnAgentOfAnotherClusterIsHeldDrainedAndNeitherObeyedNorHeard) {
  const std::string ours = read_all(dir_.file("state") + "/cluster-id");
  auto hello = hello_for("gpu-a", "10.0.0.1", 2);
  hello.cluster = "another-cluster";
  hello.running = {{1, 0, 0, 4242}};  // "job 1" there is not our job 1
  ScriptedAgent a(coord_.url(), certs_, hello);
  ASSERT_TRUE(a.connect());
  EXPECT_EQ(a.welcome().cluster + "\n", ours) << "the welcome names this coordinator's cluster";
  model::JobId id = submit("name: one\ncommand: [sleep, '1']\nresources: {nodes: 1, gpus_per_node: 1}\n");
  ASSERT_GT(id, 0);
  // Its reports change nothing and are not acknowledged: they wait for their own cluster.
  a.send(protocol::RankExited{id, 0, 0, 0, 0, "exited with code 0", false});
  Json nodes = Json::parse(call("GET", "/v1/nodes").body);
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0]["state"], "drained");
  const std::string reason = nodes[0]["reason"];
  EXPECT_EQ(reason.rfind("held: this node's agent serves cluster another-cluster", 0), 0u) << reason;
  EXPECT_FALSE(a.expect<protocol::Ack>(1s).has_value());
  EXPECT_FALSE(a.expect<protocol::Reconcile>(1s).has_value()) << "a reconcile would kill the other cluster's ranks";
  EXPECT_FALSE(a.expect<protocol::Prepare>(1s).has_value());
  EXPECT_EQ(job(id)["state"], "PENDING");

  // The same node, its agent one of ours (restarted, so it names no cluster yet): it works.
  a.disconnect();
  ScriptedAgent b(coord_.url(), certs_, hello_for("gpu-a", "10.0.0.1", 2));
  ASSERT_TRUE(b.connect());
  EXPECT_TRUE(b.expect<protocol::Prepare>().has_value());
}

// ---- a full disk

// A small tmpfs mounted on a folder for the test's life (root only).
class SmallFileSystem {
 public:
  SmallFileSystem(const std::string& at, const std::string& size) : at_(at) {
    std::filesystem::create_directories(at);
    mounted_ = ::mount("tmpfs", at.c_str(), "tmpfs", 0, ("size=" + size + ",mode=0700").c_str()) == 0;
    if (!mounted_) why_ = std::strerror(errno);
  }
  ~SmallFileSystem() {
    if (mounted_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

  // Writes `file` until the file system has no space left.
  void fill(const std::string& file) {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    std::string block(64 * 1024, 'x');
    while (fd >= 0 && ::write(fd, block.data(), block.size()) > 0) {
    }
    // The last pages: smaller writes until not even one byte fits.
    while (fd >= 0 && ::write(fd, block.data(), 512) > 0) {
    }
    while (fd >= 0 && ::write(fd, block.data(), 1) > 0) {
    }
    if (fd >= 0) ::close(fd);
  }

 private:
  std::string at_;
  bool mounted_ = false;
  std::string why_;
};

TEST(CoordinatorFullDiskTest, AFullDiskRefusesWritesKeepsServingAndRecoversByItselfLosingNothingAcknowledged) {
  testing::TempDir dir;
  SmallFileSystem fs(dir.file("state"), "6m");
  if (!fs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (" << fs.why() << "): needs root";
  CoordinatorProcess coord(dir);
  ASSERT_TRUE(coord.init_ok());
  ASSERT_TRUE(coord.start());
  const std::string spec = "name: w\ncommand: [sleep, '1']\nresources: {gpus: 1}\n";
  const std::string body = Json{{"spec", spec}, {"file", "job.yaml"}}.dump();
  const std::vector<std::pair<std::string, std::string>> auth = {{"Authorization", "Bearer " + coord.token()}};
  std::vector<model::JobId> acknowledged;
  auto submit = [&](net::HttpClient& c) -> int {
    auto r = c.request("POST", "/v1/jobs", body, auth);
    if (!r) return 0;  // no answer in time: the job may or may not exist, it was not acknowledged
    if (r->status == 201) acknowledged.push_back(Json::parse(r->body)["id"].get<model::JobId>());
    return r->status;
  };
  auto client = coord.client(2s);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(submit(*client), 201);

  fs.fill(dir.file("state") + "/fill");
  // Submissions go on until the database must grow and cannot: from then on they are
  // refused with 503, and the one whose write failed first waits for the disk.
  std::string refusal;
  std::string held_key;  // the submission whose answer waits for the disk
  for (int i = 0; i < 3000 && refusal.empty(); ++i) {
    const std::string key = "full-disk-" + std::to_string(i);
    auto keyed = auth;
    keyed.emplace_back("Idempotency-Key", key);
    auto r = client->request("POST", "/v1/jobs", body, keyed);
    if (!r) {
      held_key = key;
      client = coord.client(2s);  // that request waits for the disk; carry on with another connection
      continue;
    }
    if (r->status == 201) acknowledged.push_back(Json::parse(r->body)["id"].get<model::JobId>());
    if (r->status == 503) refusal = r->body;
  }
  ASSERT_FALSE(refusal.empty()) << "no write was ever refused on a full disk";
  EXPECT_NE(refusal.find("cannot write its database"), std::string::npos) << refusal;
  // Still up, still reading from memory.
  auto list = client->request("GET", "/v1/jobs", "", auth);
  ASSERT_TRUE(list.has_value());
  EXPECT_EQ(list->status, 200);
  auto metrics = client->request("GET", "/metrics", "", {});
  ASSERT_TRUE(metrics.has_value());
  EXPECT_NE(metrics->body.find("\ncorral_store_failing 1\n"), std::string::npos);
  auto status = client->request("GET", "/v1/status", "", {});
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(Json::parse(status->body)["store_error"].get<std::string>(), "");

  // A retry of the submission that waits for the disk is not told "refused" about a job
  // that will exist: it waits for the same commit.
  ASSERT_FALSE(held_key.empty());
  auto retry_headers = auth;
  retry_headers.emplace_back("Idempotency-Key", held_key);
  EXPECT_FALSE(client->request("POST", "/v1/jobs", body, retry_headers).has_value());
  client = coord.client(2s);

  // Space again: writes are served within about a second, without a restart.
  std::filesystem::remove(dir.file("state") + "/fill");
  const auto freed = std::chrono::steady_clock::now();
  int code = 0;
  while (code != 201 && std::chrono::steady_clock::now() - freed < 10s) {
    code = submit(*client);
    if (code == 0) client = coord.client(2s);
  }
  const auto took = std::chrono::steady_clock::now() - freed;
  EXPECT_EQ(code, 201);
  EXPECT_LT(took, 1500ms) << "writes came back after "
                          << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  metrics = client->request("GET", "/metrics", "", {});
  ASSERT_TRUE(metrics.has_value());
  EXPECT_NE(metrics->body.find("\ncorral_store_failing 0\n"), std::string::npos);
  // Its job was made once, when the disk took it.
  auto repeated = client->request("POST", "/v1/jobs", body, retry_headers);
  ASSERT_TRUE(repeated.has_value());
  EXPECT_EQ(repeated->status, 201) << repeated->body;
  EXPECT_EQ(Json::parse(repeated->body).value("repeated", false), true) << repeated->body;

  // Nothing acknowledged was lost: every 201 is on disk after a SIGKILL.
  coord.kill9();
  ASSERT_TRUE(coord.start());
  client = coord.client(5s);
  for (model::JobId id : acknowledged) {
    auto r = client->request("GET", "/v1/jobs/" + std::to_string(id), "", auth);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200) << "acknowledged job " << id << " was lost";
  }
}

// Two users' jobs on one two-GPU node: the admin ("tester") and bob each run one job (a
// GPU apiece) and have one that ended (cancelled while it waited).
class PrivateDataTest : public ::testing::Test {
 protected:
  void start(const std::string& settings) {
    coord_ = std::make_unique<CoordinatorProcess>(dir_, settings);
    ASSERT_TRUE(coord_->init_ok());
    ASSERT_TRUE(coord_->start());
    std::string certs = coord_->agent_cert("gpu-a");
    ASSERT_FALSE(certs.empty());
    bob_ = coord_->add_user("bob");
    ASSERT_EQ(bob_.size(), 64u);
    admin_ = coord_->token();
    http_ = coord_->client();
    agent_ = std::make_unique<ScriptedAgent>(coord_->url(), certs, hello_for("gpu-a", "10.0.0.1", 2));
    ASSERT_TRUE(agent_->connect());
    ASSERT_NO_FATAL_FAILURE(run_one(admin_, admins_running_));
    ASSERT_NO_FATAL_FAILURE(run_one(bob_, bobs_running_));
    ASSERT_NO_FATAL_FAILURE(end_one(admin_, admins_ended_));
    ASSERT_NO_FATAL_FAILURE(end_one(bob_, bobs_ended_));
  }

  void TearDown() override {
    if (HasFailure() && coord_) {
      for (const auto& line : coord_->process().lines()) std::cerr << "coordinator: " << line << "\n";
    }
  }

  // token "": no Authorization header.
  net::HttpResponse call(const std::string& token, const std::string& method, const std::string& target,
                         const std::string& body = "") {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!token.empty()) headers.emplace_back("Authorization", "Bearer " + token);
    auto r = http_->request(method, target, body, headers);
    EXPECT_TRUE(r.has_value()) << r.error().message();
    return r ? *r : net::HttpResponse{0, "", "", {}};
  }
  Json get(const std::string& token, const std::string& target) {
    auto r = call(token, "GET", target);
    EXPECT_EQ(r.status, 200) << target << ": " << r.body;
    return r.status == 200 ? Json::parse(r.body) : Json();
  }
  static std::vector<model::JobId> ids(const Json& list) {
    std::vector<model::JobId> out;
    for (const auto& j : list) out.push_back(j["id"]);
    return out;
  }
  model::JobId submit(const std::string& token, const std::string& name) {
    const std::string spec = "name: " + name + "\ncommand: [python3, train.py]\nresources: {gpus_per_node: 1}\n";
    auto r = http_->request("POST", "/v1/jobs", Json{{"spec", spec}}.dump(), {{"Authorization", "Bearer " + token}});
    EXPECT_TRUE(r.has_value() && r->status == 201) << (r ? r->body : r.error().message());
    return r && r->status == 201 ? Json::parse(r->body)["id"].get<model::JobId>() : 0;
  }
  void run_one(const std::string& token, model::JobId& id) {
    id = submit(token, token == admin_ ? "admins-run" : "bobs-run");
    auto prepare = agent_->expect<protocol::Prepare>();
    ASSERT_TRUE(prepare.has_value());
    ASSERT_EQ(prepare->job, id);
    agent_->send(protocol::PrepareResult{id, 0, true, false, "", "", prepare->master_port});
    ASSERT_TRUE(agent_->expect<protocol::Launch>().has_value());
    agent_->send(protocol::RankStarted{id, 0, 0, 4242});
    ASSERT_TRUE(testing::eventually([&] { return get(admin_, "/v1/jobs/" + std::to_string(id))["state"] == "RUNNING"; }, 5s));
  }
  void end_one(const std::string& token, model::JobId& id) {
    id = submit(token, token == admin_ ? "admins-old" : "bobs-old");  // waits: both GPUs are held
    auto r = call(token, "POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // The status page's data as `token` sees it: the queue's ids, the holders named, and
  // per GPU the job named (0 for none) and whether it is held.
  struct StatusSeen {
    std::vector<model::JobId> queue;
    std::vector<std::string> holders;
    std::vector<std::pair<model::JobId, bool>> gpus;
    int running = 0;
  };
  StatusSeen status(const std::string& token) {
    Json s = get(token, "/v1/status");
    StatusSeen seen;
    for (const auto& row : s["queue"]["rows"]) seen.queue.push_back(row["id"]);
    for (const auto& [id, holder] : s["holders"].items()) seen.holders.push_back(id);
    for (const auto& g : s["nodes"][0]["gpus"]) seen.gpus.emplace_back(g["job"].is_null() ? 0 : g["job"].get<model::JobId>(), g["held"]);
    seen.running = s["jobs_by_state"].value("RUNNING", 0);
    return seen;
  }

  testing::TempDir dir_;
  std::unique_ptr<CoordinatorProcess> coord_;
  std::unique_ptr<net::HttpClient> http_;
  std::unique_ptr<ScriptedAgent> agent_;
  std::string admin_, bob_;
  model::JobId admins_running_ = 0, bobs_running_ = 0, admins_ended_ = 0, bobs_ended_ = 0;
};

TEST_F(PrivateDataTest, WithoutPrivateDataEveryUserSeesEveryonesJobsHistoryAndUsage) {
  ASSERT_NO_FATAL_FAILURE(start(""));
  EXPECT_EQ(ids(get(bob_, "/v1/jobs")), (std::vector<model::JobId>{admins_running_, bobs_running_}));
  EXPECT_EQ(ids(get(bob_, "/v1/jobs?user=tester&all=1")), (std::vector<model::JobId>{admins_running_, admins_ended_}));
  Json other = get(bob_, "/v1/jobs/" + std::to_string(admins_running_));
  EXPECT_EQ(other["name"], "admins-run");
  EXPECT_FALSE(other.contains("spec"));
  EXPECT_EQ(call(bob_, "GET", "/v1/jobs/" + std::to_string(admins_running_) + "/logs").status, 403);
  EXPECT_EQ(ids(get(bob_, "/v1/history")), (std::vector<model::JobId>{admins_ended_, bobs_ended_}));
  Json usage = get(bob_, "/v1/usage");
  ASSERT_EQ(usage["rows"].size(), 2u) << usage.dump();
  EXPECT_EQ(usage["own_only"], false);
  EXPECT_EQ(get(bob_, "/v1/usage?by=node")["rows"][0]["jobs"], 2);
  StatusSeen anonymous = status("");
  EXPECT_EQ(anonymous.queue, (std::vector<model::JobId>{admins_running_, bobs_running_}));
  EXPECT_EQ(anonymous.holders.size(), 2u);
  EXPECT_EQ(anonymous.gpus, (std::vector<std::pair<model::JobId, bool>>{{admins_running_, true}, {bobs_running_, true}}));
  Json nodes = get(bob_, "/v1/nodes");
  EXPECT_EQ(nodes[0]["gpus"][0]["job"], admins_running_);
  EXPECT_EQ(nodes[0]["gpus"][0]["held"], true);
  auto metrics = call("", "GET", "/metrics");
  EXPECT_NE(metrics.body.find("corral_gpus_allocated_by_user{user=\"bob\"} 1"), std::string::npos) << metrics.body;
}

TEST_F(PrivateDataTest, PrivateDataShowsAUserTheirOwnJobsHistoryAndUsageAndAnAdminEveryones) {
  ASSERT_NO_FATAL_FAILURE(start("private_data: [history, usage, jobs]\n"));
  const std::string admins = std::to_string(admins_running_);
  // Jobs: bob's own, whatever users he names; another's job is as one that does not exist.
  EXPECT_EQ(ids(get(bob_, "/v1/jobs")), (std::vector<model::JobId>{bobs_running_}));
  EXPECT_EQ(ids(get(bob_, "/v1/jobs?all=1")), (std::vector<model::JobId>{bobs_running_, bobs_ended_}));
  EXPECT_TRUE(get(bob_, "/v1/jobs?user=tester&all=1").empty());
  EXPECT_EQ(ids(get(bob_, "/v1/jobs?user=tester,bob")), (std::vector<model::JobId>{bobs_running_}));
  for (const std::string& target : {"/v1/jobs/" + admins, "/v1/jobs/" + admins + "?wait=5", "/v1/jobs/" + admins + "/logs",
                                    "/v1/jobs/" + admins + "/stack", "/v1/jobs/" + std::to_string(admins_ended_)}) {
    auto r = call(bob_, "GET", target);
    EXPECT_EQ(r.status, 404) << target << ": " << r.body;
    EXPECT_EQ(r.body.find("tester"), std::string::npos) << target << ": " << r.body;
  }
  auto cancel = call(bob_, "POST", "/v1/jobs/" + admins + "/cancel");
  EXPECT_EQ(cancel.status, 404) << cancel.body;
  auto bulk = call(bob_, "POST", "/v1/jobs/cancel", Json{{"ids", {admins_running_, admins_ended_}}}.dump());
  ASSERT_EQ(bulk.status, 200) << bulk.body;
  const Json answer = Json::parse(bulk.body);  // kept: a range-for over a temporary's member dangles
  EXPECT_TRUE(answer["cancelled"].empty()) << bulk.body;
  for (const auto& failed : answer["failed"]) EXPECT_EQ(failed["status"], 404) << bulk.body;
  EXPECT_EQ(bulk.body.find("tester"), std::string::npos) << bulk.body;
  EXPECT_EQ(get(admin_, "/v1/jobs/" + admins)["state"], "RUNNING");
  EXPECT_EQ(get(bob_, "/v1/jobs/" + std::to_string(bobs_running_))["name"], "bobs-run");
  EXPECT_EQ(ids(get(admin_, "/v1/jobs")), (std::vector<model::JobId>{admins_running_, bobs_running_}));
  EXPECT_EQ(get(admin_, "/v1/jobs/" + std::to_string(bobs_running_))["name"], "bobs-run");

  // History: bob's own ended jobs; another user's are none.
  EXPECT_EQ(ids(get(bob_, "/v1/history")), (std::vector<model::JobId>{bobs_ended_}));
  EXPECT_TRUE(get(bob_, "/v1/history?user=tester").empty());
  EXPECT_EQ(ids(get(admin_, "/v1/history")), (std::vector<model::JobId>{admins_ended_, bobs_ended_}));

  // Usage: bob's own GPU time, by user, node or class.
  Json by_user = get(bob_, "/v1/usage");
  ASSERT_EQ(by_user["rows"].size(), 1u) << by_user.dump();
  EXPECT_EQ(by_user["rows"][0]["user"], "bob");
  EXPECT_EQ(by_user["own_only"], true);
  for (const char* by : {"node", "class"}) {
    Json rows = get(bob_, std::string("/v1/usage?by=") + by)["rows"];
    ASSERT_EQ(rows.size(), 1u) << rows.dump();
    EXPECT_EQ(rows[0]["jobs"], 1) << by;
  }
  EXPECT_EQ(get(admin_, "/v1/usage")["rows"].size(), 2u);
  EXPECT_EQ(get(admin_, "/v1/usage?by=node")["rows"][0]["jobs"], 2);
  EXPECT_EQ(get(admin_, "/v1/usage")["own_only"], false);

  // The status page: bob's jobs named, the other GPU held by no one named; without a
  // token, no job at all; an admin, every one. The counts stay the cluster's.
  StatusSeen bobs = status(bob_);
  EXPECT_EQ(bobs.queue, (std::vector<model::JobId>{bobs_running_}));
  EXPECT_EQ(bobs.holders, (std::vector<std::string>{std::to_string(bobs_running_)}));
  EXPECT_EQ(bobs.gpus, (std::vector<std::pair<model::JobId, bool>>{{0, true}, {bobs_running_, true}}));
  EXPECT_EQ(bobs.running, 2);
  StatusSeen anonymous = status("");
  EXPECT_TRUE(anonymous.queue.empty());
  EXPECT_TRUE(anonymous.holders.empty());
  EXPECT_EQ(anonymous.gpus, (std::vector<std::pair<model::JobId, bool>>{{0, true}, {0, true}}));
  auto raw = call("", "GET", "/v1/status");
  EXPECT_EQ(raw.body.find("bobs-run"), std::string::npos) << raw.body;
  EXPECT_EQ(raw.body.find("\"bob\""), std::string::npos) << raw.body;
  StatusSeen admin = status(admin_);
  EXPECT_EQ(admin.queue, (std::vector<model::JobId>{admins_running_, bobs_running_}));
  EXPECT_EQ(admin.gpus, (std::vector<std::pair<model::JobId, bool>>{{admins_running_, true}, {bobs_running_, true}}));
  // A token the coordinator does not know is refused, not taken for no token.
  EXPECT_EQ(call(std::string(64, 'f'), "GET", "/v1/status").status, 401);

  // The node listing (corral nodes --gpus): every GPU held, only the viewer's jobs named.
  auto node_gpus = [&](const std::string& token) {
    std::vector<std::pair<model::JobId, bool>> out;
    const Json nodes = get(token, "/v1/nodes");  // kept: a range-for over a temporary's member dangles
    for (const auto& g : nodes[0]["gpus"]) {
      out.emplace_back(g["job"].is_null() ? 0 : g["job"].get<model::JobId>(), g["held"]);
    }
    return out;
  };
  EXPECT_EQ(node_gpus(bob_), (std::vector<std::pair<model::JobId, bool>>{{0, true}, {bobs_running_, true}}));
  EXPECT_EQ(node_gpus(admin_),
            (std::vector<std::pair<model::JobId, bool>>{{admins_running_, true}, {bobs_running_, true}}));
  EXPECT_EQ(get(bob_, "/v1/nodes?gpus=classes")[0]["gpu_classes"][0]["used"], 2);

  // Metrics: the per-user series for an admin's scrape only.
  for (const std::string& token : {std::string(), bob_}) {
    auto m = call(token, "GET", "/metrics");
    ASSERT_EQ(m.status, 200);
    EXPECT_EQ(m.body.find("user=\""), std::string::npos) << m.body;
    EXPECT_NE(m.body.find("corral_jobs_ended_total{state=\"CANCELLED\"} 2"), std::string::npos) << m.body;
  }
  auto m = call(admin_, "GET", "/metrics");
  EXPECT_NE(m.body.find("corral_gpus_allocated_by_user{user=\"bob\"} 1"), std::string::npos) << m.body;
}

}  // namespace
}  // namespace corral
