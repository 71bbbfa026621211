// corral-worker tcp-check as the agent runs it: real processes, one per rank, meeting on
// 127.0.0.1 at a port the kernel found free.

#include <memory>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/unit/worker/worker_process.hpp"

namespace corral::worker {
namespace {

using testing::Finished;
using testing::free_port;
using testing::WorkerProcess;
using Env = std::map<std::string, std::string>;

struct Job {
  int world = 4;
  int nnodes = 2;
  int port = 0;
  int id = 7;
  int attempt = 0;

  // Rank `rank`'s environment, as the agent builds it.
  Env rank(int r) const {
    int per_node = world / nnodes;
    std::string nodes;
    for (int n = 0; n < nnodes; ++n) nodes += (n == 0 ? "n" : ",n") + std::to_string(n);
    return {
        {"WORLD_SIZE", std::to_string(world)},
        {"RANK", std::to_string(r)},
        {"LOCAL_RANK", std::to_string(r % per_node)},
        {"LOCAL_WORLD_SIZE", std::to_string(per_node)},
        {"NODE_RANK", std::to_string(r / per_node)},
        {"GROUP_RANK", std::to_string(r / per_node)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port)},
        {"CORRAL_JOB_ID", std::to_string(id)},
        {"CORRAL_ATTEMPT", std::to_string(attempt)},
        {"CORRAL_NNODES", std::to_string(nnodes)},
        {"CORRAL_NODELIST", nodes},
        {"CUDA_VISIBLE_DEVICES", ""},
    };
  }
};

std::unique_ptr<WorkerProcess> start(const Env& env, const std::string& timeout = "20") {
  auto p = std::make_unique<WorkerProcess>(std::vector<std::string>{"tcp-check", "--timeout", timeout}, env);
  EXPECT_TRUE(p->started());
  return p;
}

// The one JSON line every run prints, whatever happened.
nlohmann::json report(const Finished& f) {
  auto lines = std::count(f.out.begin(), f.out.end(), '\n');
  EXPECT_EQ(lines, 1) << f.out;
  auto json = nlohmann::json::parse(f.out, nullptr, false);
  EXPECT_FALSE(json.is_discarded()) << f.out;
  return json;
}

std::string where(const Job& job) {
  return "127.0.0.1:" + std::to_string(job.port);
}

TEST(TcpCheck, FourRanksOnTwoNodesAgreeOnTheSum) {
  Job job{.port = free_port()};
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  // Peers first: they must keep trying until rank 0 listens.
  for (int r : {3, 1, 2, 0}) ranks.push_back(start(job.rank(r)));
  for (auto& p : ranks) {
    Finished f = p->finish();
    ASSERT_EQ(f.exit_code, 0) << f.err;
    auto json = report(f);
    EXPECT_EQ(json["check"], "tcp");
    EXPECT_EQ(json["ok"], true);
    EXPECT_EQ(json["sum"], 1 + 2 + 3 + 4);
    EXPECT_EQ(json["world_size"], 4);
    EXPECT_EQ(json["master_addr"], "127.0.0.1");
    EXPECT_EQ(json["master_port"], job.port);
    EXPECT_EQ(json["job_id"], 7);
    EXPECT_EQ(json["attempt"], 0);
    EXPECT_EQ(json["cuda_visible_devices"], "");
    EXPECT_EQ(json["node_rank"], json["rank"].get<int>() / 2);
    EXPECT_EQ(json["local_rank"], json["rank"].get<int>() % 2);
    EXPECT_FALSE(json["hostname"].get<std::string>().empty());
  }
}

TEST(TcpCheck, ASingleRankOnlyProvesThePortIsFree) {
  Job job{.world = 1, .nnodes = 1, .port = free_port()};
  Finished f = start(job.rank(0))->finish();
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(report(f)["sum"], 1);
}

TEST(TcpCheck, ARankWhoseEnvironmentContradictsItselfFailsAtOnce) {
  Job job{.port = free_port()};
  Env env = job.rank(1);
  env["WORLD_SIZE"] = "5";
  Finished f = start(env)->finish();
  EXPECT_EQ(f.exit_code, 3);
  EXPECT_EQ(f.err, "tcp-check: rank 1: WORLD_SIZE=5 but CORRAL_NNODES=2 * LOCAL_WORLD_SIZE=2 = 4\n");
  auto json = report(f);
  EXPECT_EQ(json["ok"], false);
  EXPECT_EQ(json["rank"], 1);
  EXPECT_EQ(json["exit_code"], 3);
  EXPECT_EQ(json["error"], "WORLD_SIZE=5 but CORRAL_NNODES=2 * LOCAL_WORLD_SIZE=2 = 4");
}

TEST(TcpCheck, AMissingVariableIsNamed) {
  Job job{.port = free_port()};
  Env env = job.rank(2);
  env.erase("MASTER_PORT");
  Finished f = start(env)->finish();
  EXPECT_EQ(f.exit_code, 3);
  EXPECT_EQ(f.err, "tcp-check: rank 2: missing environment: MASTER_PORT\n");
}

TEST(TcpCheck, RankZeroRefusesARankWithAnotherWorldSize) {
  Job job{.world = 2, .nnodes = 2, .port = free_port()};
  // Consistent on its own, but from a four-rank picture of the job.
  Job other{.world = 4, .nnodes = 2, .port = job.port};
  auto root = start(job.rank(0));
  auto odd = start(other.rank(1));
  Finished r = root->finish();
  Finished o = odd->finish();
  const std::string why = "rank 1 has WORLD_SIZE=4 but rank 0 has WORLD_SIZE=2";
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_NE(r.err.find("tcp-check: rank 0: " + why), std::string::npos) << r.err;
  EXPECT_EQ(report(r)["error"], why);
  EXPECT_EQ(o.exit_code, 5) << o.err;
  EXPECT_NE(o.err.find("rank 0 at " + where(job) + " refused this rank: " + why), std::string::npos) << o.err;
}

TEST(TcpCheck, TwoJobsGivenOnePortAreToldApart) {
  Job a{.world = 2, .nnodes = 2, .port = free_port(), .id = 7};
  Job b{.world = 2, .nnodes = 2, .port = a.port, .id = 8};
  auto a0 = start(a.rank(0));
  ASSERT_TRUE(a0->wait_for("listening on " + where(a), true));

  // B's rank 0 cannot take the port, and says so.
  Finished b0 = start(b.rank(0))->finish();
  EXPECT_EQ(b0.exit_code, 6);
  EXPECT_NE(b0.err.find("cannot listen on " + where(a) + " (MASTER_ADDR=127.0.0.1): Address already in use"),
            std::string::npos)
      << b0.err;

  // B's rank 1 reaches A's rank 0, which turns it away without failing A.
  Finished b1 = start(b.rank(1))->finish();
  EXPECT_EQ(b1.exit_code, 5);
  EXPECT_NE(
      b1.err.find("refused this rank: this is the rendezvous of job 7 attempt 0, not of job 8 attempt 0: "
                  "two jobs were given one port"),
      std::string::npos)
      << b1.err;
  EXPECT_EQ(report(b1)["exit_code"], 5);

  Finished a1 = start(a.rank(1))->finish();
  Finished a0_done = a0->finish();
  ASSERT_EQ(a0_done.exit_code, 0) << a0_done.err;
  ASSERT_EQ(a1.exit_code, 0) << a1.err;
  EXPECT_EQ(report(a0_done)["sum"], 3);
  EXPECT_EQ(report(a1)["sum"], 3);
  EXPECT_NE(a0_done.err.find("refused rank 1 of job 8 attempt 0 from 127.0.0.1:"), std::string::npos)
      << a0_done.err;
}

TEST(TcpCheck, AnEarlierAttemptsRankIsTurnedAway) {
  Job now{.world = 2, .nnodes = 2, .port = free_port(), .attempt = 1};
  Job before = now;
  before.attempt = 0;
  auto root = start(now.rank(0));
  ASSERT_TRUE(root->wait_for("listening on", true));
  Finished stale = start(before.rank(1))->finish();
  EXPECT_EQ(stale.exit_code, 5);
  EXPECT_NE(stale.err.find("this is the rendezvous of job 7 attempt 1, not of job 7 attempt 0"),
            std::string::npos)
      << stale.err;
  Finished peer = start(now.rank(1))->finish();
  EXPECT_EQ(peer.exit_code, 0) << peer.err;
  EXPECT_EQ(root->finish().exit_code, 0);
}

TEST(TcpCheck, ARankClaimedTwiceFailsTheRendezvous) {
  Job job{.world = 3, .nnodes = 3, .port = free_port()};
  auto root = start(job.rank(0));
  auto first = start(job.rank(1));
  auto second = start(job.rank(1));
  Finished r = root->finish();
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_NE(r.err.find("tcp-check: rank 0: rank 1 is claimed twice, from 127.0.0.1:"), std::string::npos)
      << r.err;
  EXPECT_EQ(first->finish().exit_code, 5);
  EXPECT_EQ(second->finish().exit_code, 5);
}

TEST(TcpCheck, WithoutRankZeroTheOthersTimeOut) {
  Job job{.world = 3, .nnodes = 3, .port = free_port()};
  auto r1 = start(job.rank(1), "0.5");
  auto r2 = start(job.rank(2), "0.5");
  for (auto* p : {r1.get(), r2.get()}) {
    Finished f = p->finish();
    EXPECT_EQ(f.exit_code, 4);
    EXPECT_NE(f.err.find("timed out after 500ms reaching rank 0 at " + where(job) +
                         " (last error: connect to " + where(job) + ": Connection refused)"),
              std::string::npos)
        << f.err;
    EXPECT_EQ(report(f)["exit_code"], 4);
  }
}

TEST(TcpCheck, RankZeroNamesTheRanksThatNeverCame) {
  Job job{.world = 3, .nnodes = 3, .port = free_port()};
  // Long enough for rank 1 to arrive on a busy machine; rank 2 never does.
  auto root = start(job.rank(0), "3");
  ASSERT_TRUE(root->wait_for("listening on", true));
  auto r1 = start(job.rank(1), "10");
  Finished r = root->finish();
  Finished one = r1->finish();
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find("timed out after 3s at " + where(job) + " waiting for rank 2 (2 of 3 arrived)"),
            std::string::npos)
      << r.err << "\nrank 1:\n" << one.err;
  EXPECT_EQ(one.exit_code, 4) << one.err;  // told by rank 0 that the rendezvous failed
}

TEST(TcpCheck, RankZeroTurnsAwayAStrangerAndCarriesOn) {
  Job job{.world = 2, .nnodes = 2, .port = free_port()};
  auto root = start(job.rank(0));
  ASSERT_TRUE(root->wait_for("listening on", true));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(job.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string request = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string answer;
  char buf[512];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  EXPECT_EQ(answer.rfind("corral-tcp-check/1 refused not a corral tcp-check hello", 0), 0u) << answer;

  Finished peer = start(job.rank(1))->finish();
  EXPECT_EQ(peer.exit_code, 0) << peer.err;
  EXPECT_EQ(root->finish().exit_code, 0);
}

TEST(TcpCheck, ChecksTheDeviceCountWhenAsked) {
  Job job{.world = 1, .nnodes = 1, .port = free_port()};
  WorkerProcess p({"tcp-check", "--gpus-per-rank", "1"}, job.rank(0));
  Finished f = p.finish();
  EXPECT_EQ(f.exit_code, 3);
  EXPECT_EQ(report(f)["error"], "CUDA_VISIBLE_DEVICES=\"\" lists 0 devices but --gpus-per-rank 1");
}

TEST(CorralWorker, UsageErrorsExitWithTwo) {
  EXPECT_EQ(WorkerProcess({"tcp-check", "--bogus", "1"}, {}).finish().exit_code, 2);
  EXPECT_EQ(WorkerProcess({"tcp-check", "--timeout", "soon"}, {}).finish().exit_code, 2);
  EXPECT_EQ(WorkerProcess({"frobnicate"}, {}).finish().exit_code, 2);
  EXPECT_EQ(WorkerProcess({}, {}).finish().exit_code, 2);
}

TEST(CorralWorker, GpuCommandsSayTheyAreUnavailableInABuildWithoutCuda) {
  if (CORRAL_WORKER_HAS_GPU)
    GTEST_SKIP() << "this corral-worker was built with CUDA and NCCL; tests/gpu covers it";
  for (std::string command : {"nccl-root", "nccl-check", "preflight"}) {
    Finished f = WorkerProcess({command}, {}).finish();
    EXPECT_EQ(f.exit_code, 9);
    EXPECT_EQ(f.err, "corral-worker: built without CUDA/NCCL; " + command + " is unavailable\n");
  }
}

}  // namespace
}  // namespace corral::worker
