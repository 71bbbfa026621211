// The real `corral` binary against a scripted coordinator: a net::Server over TLS on
// 127.0.0.1 that answers each request at once from a table. Checks what people and
// scripts see: stdout, stderr and exit codes.

#include <fstream>
#include <mutex>
#include <thread>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include "common/net/pki.hpp"
#include "common/net/server.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral {
namespace {

constexpr const char* kToken = "s3cret-token";

// Answers "METHOD /path" from a table; 401 without the right bearer token, as the
// coordinator does. Runs on the loop thread; the test reads `seen` after the child exits.
class ScriptedCoordinator : public net::ServerHandler {
 public:
  void on(const std::string& method_and_path, int status, std::string body) {
    std::lock_guard lock(mu_);
    answers_[method_and_path] = {status, "application/json", std::move(body), {}};
  }
  // The next `n` requests to this endpoint are read and then their connection is closed
  // unanswered, as when a coordinator dies after its commit and before its answer.
  void drop(const std::string& method_and_path, int n) {
    std::lock_guard lock(mu_);
    drops_[method_and_path] = n;
  }
  std::vector<net::HttpRequest> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

  void on_http(const net::HttpRequest& request, std::function<void(net::HttpResponse)> respond) override {
    std::lock_guard lock(mu_);
    seen_.push_back(request);
    if (request.header("authorization") != std::string("Bearer ") + kToken) {
      return respond({401, "application/json", R"({"error": "unknown token"})", {}});
    }
    if (int& left = drops_[request.method + " " + request.path]; left > 0) {
      --left;
      return;  // `respond` goes unused: the session, and its connection, end with it
    }
    auto it = answers_.find(request.method + " " + request.path);
    if (it == answers_.end())
      return respond({404, "application/json", R"({"error": "no such endpoint"})", {}});
    respond(it->second);
  }
  Result<void> accept_ws(const net::HttpRequest&) override {
    return make_error(ErrorCode::PermissionDenied, "no agents here");
  }
  void on_ws_open(const std::shared_ptr<net::WsConnection>&) override {}
  void on_ws_message(const std::shared_ptr<net::WsConnection>&, std::string) override {}
  void on_ws_close(const std::shared_ptr<net::WsConnection>&) override {}

 private:
  std::mutex mu_;
  std::map<std::string, net::HttpResponse> answers_;
  std::map<std::string, int> drops_;
  std::vector<net::HttpRequest> seen_;
};

using testing::Outcome;

class CliIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(net::create_ca(dir_.file("ca.pem"), dir_.file("ca.key"), "corral test CA").has_value());
    ASSERT_TRUE(net::issue_certificate(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("server.pem"),
                                       dir_.file("server.key"), {"coordinator", {"127.0.0.1"}, true, false})
                    .has_value());
    net::ServerOptions opts;
    opts.host = "127.0.0.1";
    opts.tls = {"", dir_.file("server.pem"), dir_.file("server.key")};
    auto server = net::Server::start(loop_, opts, coordinator_);
    ASSERT_TRUE(server.has_value()) << server.error().message();
    server_ = std::move(*server);
    url_ = "https://127.0.0.1:" + std::to_string(server_->port());
    thread_ = std::thread([this] { loop_.run(); });
  }
  void TearDown() override {
    loop_.post([this] {
      server_->stop();
      loop_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

  // Runs `corral args...` with the connection in its environment and a home of its own,
  // so that no settings file of the person running the tests is read.
  Outcome corral(const std::vector<std::string>& args, const std::string& url = {},
                 const std::string& token = kToken, const std::string& ca = {}) {
    std::vector<std::string> argv{CORRAL_CLI_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env{"HOME=" + dir_.path().string(), "XDG_CONFIG_HOME=" + dir_.file("xdg"),
                                 "CORRAL_URL=" + (url.empty() ? url_ : url), "CORRAL_TOKEN=" + token,
                                 "CORRAL_CA=" + (ca.empty() ? dir_.file("ca.pem") : ca),
                                 // Each command on its own, as the scripted coordinator expects.
                                 "CORRAL_KEEP_CONNECTION=0"};
    return testing::run_to_end(argv, env);
  }

  std::string write_file(const std::string& name, const std::string& text) {
    std::ofstream(dir_.file(name)) << text;
    return dir_.file(name);
  }

  testing::TempDir dir_;
  net::EventLoop loop_;
  ScriptedCoordinator coordinator_;
  std::unique_ptr<net::Server> server_;
  std::string url_;
  std::thread thread_;
};

TEST_F(CliIntegrationTest, SubmitPrintsTheNewJobsId) {
  coordinator_.on("POST /v1/jobs", 201, R"({"id": 42})");
  std::string spec = write_file("train.yaml", "name: t\ncommand: c\nresources:\n  gpus_per_node: 1\n");
  auto r = corral({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Submitted job 42\n");
  auto seen = coordinator_.seen();
  ASSERT_EQ(seen.size(), 1u);
  auto body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body["file"], "train.yaml");
  EXPECT_EQ(body["dry_run"], false);
  EXPECT_EQ(body["spec"], "name: t\ncommand: c\nresources:\n  gpus_per_node: 1\n");
}

// The coordinator read the submission and its answer was lost: `corral submit` sends it
// again with the same key (which the coordinator answers with the job it made) and
// prints one id. Another submission carries another key.
TEST_F(CliIntegrationTest, ASubmitWhoseAnswerIsLostIsSentAgainWithItsKeyAndPrintsOneId) {
  coordinator_.on("POST /v1/jobs", 201, R"({"id": 42, "ids": [42], "repeated": true})");
  coordinator_.drop("POST /v1/jobs", 2);
  std::string spec = write_file("train.yaml", "name: t\ncommand: c\nresources:\n  gpus_per_node: 1\n");
  auto r = corral({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Submitted job 42\n");
  auto seen = coordinator_.seen();
  ASSERT_EQ(seen.size(), 3u);
  const std::string key = seen[0].header("idempotency-key");
  EXPECT_EQ(key.size(), 32u);
  for (const auto& s : seen) {
    EXPECT_EQ(s.header("idempotency-key"), key);
    EXPECT_EQ(s.body, seen[0].body);
  }
  r = corral({"submit", spec});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  seen = coordinator_.seen();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_NE(seen[3].header("idempotency-key"), key);
}

// Every try lost: the command fails, saying so, after a few seconds, not at once and not
// for ever.
TEST_F(CliIntegrationTest, ASubmitWhoseEveryAnswerIsLostFailsWithExit3AfterItsRetries) {
  coordinator_.on("POST /v1/jobs", 201, R"({"id": 42})");
  coordinator_.drop("POST /v1/jobs", 100);
  std::string spec = write_file("train.yaml", "name: t\ncommand: c\nresources:\n  gpus_per_node: 1\n");
  auto r = corral({"submit", spec});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("no answer after 4 tries"), std::string::npos) << r.err;
  EXPECT_EQ(coordinator_.seen().size(), 4u);
}

TEST_F(CliIntegrationTest, ACommandThatStartsTorchrunPerGpuIsSubmittedWithAWarningAndProcsPerNodeIsAFlag) {
  for (int i = 0; i < 2; ++i) coordinator_.on("POST /v1/jobs", 201, R"({"id": 42})");
  auto r = corral({"submit", "-N", "2", "--gpus-per-node", "4", "--", "torchrun", "--nproc-per-node", "4", "train.py"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Submitted job 42\n");
  EXPECT_EQ(r.err.rfind("corral: warning: the command starts torchrun in every process of the job (4 per node)", 0),
            0u)
      << r.err;
  // One torchrun per node, as it expects: no warning, and the spec says so.
  r = corral({"submit", "-N", "2", "--gpus-per-node", "4", "--procs-per-node", "1", "--", "torchrun", "train.py"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  auto seen = coordinator_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(nlohmann::json::parse(seen[1].body)["spec"].get<std::string>().find("procs_per_node: 1"),
            std::string::npos);
  // A value that does not divide the GPUs per node is refused under the flag's name; nothing is sent.
  r = corral({"submit", "--gpus-per-node", "4", "--procs-per-node", "3", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("--procs-per-node: ", 0), 0u) << r.err;
  EXPECT_EQ(coordinator_.seen().size(), 2u);
}

TEST_F(CliIntegrationTest, AnUnknownTokenExitsWith3) {
  auto r = corral({"queue"}, "", "wrong-token");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "corral: not authenticated: unknown token\n");
}

TEST_F(CliIntegrationTest, AnUnreachablePortExitsWith3) {
  // A port bound but not listening refuses connections, and nobody else can take it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto r = corral({"nodes"}, "https://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  ::close(fd);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("cannot connect"), std::string::npos) << r.err;
}

TEST_F(CliIntegrationTest, ACoordinatorCertificateFromAnotherCaExitsWith3) {
  ASSERT_TRUE(net::create_ca(dir_.file("other.pem"), dir_.file("other.key"), "someone else").has_value());
  auto r = corral({"queue"}, "", kToken, dir_.file("other.pem"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("TLS handshake"), std::string::npos) << r.err;
  EXPECT_TRUE(coordinator_.seen().empty());
}

// Needs the job spec parser (common/model/job_spec_yaml.cpp).
TEST_F(CliIntegrationTest, AnInvalidSpecExitsWith2ListingItsProblems) {
  std::string spec =
      write_file("bad.yaml", "name: t\ncommand: c\nresources:\n  gpus_per_node: four\nbogus: 1\n");
  auto r = corral({"submit", spec});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(spec + ":4:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resources.gpus_per_node"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(spec + ":5:"), std::string::npos) << r.err;
  EXPECT_TRUE(coordinator_.seen().empty());
}

TEST_F(CliIntegrationTest, BadUsageExitsWith2) {
  EXPECT_EQ(corral({"show", "not-a-number"}).exit_code, 2);
  EXPECT_EQ(corral({"no-such-command"}).exit_code, 2);
  EXPECT_TRUE(coordinator_.seen().empty());
}

TEST_F(CliIntegrationTest, WaitOnACompletedJobExits0) {
  coordinator_.on("GET /v1/jobs/7", 200, R"({"id": 7, "state": "COMPLETED", "reason": "AllRanksExitedOk",
                                              "exit_code": 0, "events": []})");
  auto r = corral({"wait", "7", "--timeout", "30"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Job 7 COMPLETED\n");
}

TEST_F(CliIntegrationTest, WaitOnAFailedJobExitsWithItsExitCode) {
  coordinator_.on("GET /v1/jobs/8", 200, R"({"id": 8, "state": "FAILED", "reason": "RankFailed",
                                              "failed_rank": 1, "failed_node": "gpu-b", "exit_code": 3})");
  auto r = corral({"wait", "8"});
  EXPECT_EQ(r.exit_code, 3);  // rank 1's, as srun passes it on
  EXPECT_EQ(r.out, "Job 8 FAILED (RankFailed): rank 1 on gpu-b, exit code 3\n");
}

TEST_F(CliIntegrationTest, QueueJsonIsAJsonList) {
  coordinator_.on("GET /v1/jobs", 200, R"([{"id": 1, "name": "a", "user": "alice", "state": "RUNNING"},
                                           {"id": 2, "name": "b", "user": "bob", "state": "PENDING"}])");
  auto r = corral({"queue", "--json", "--all"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto list = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(list.is_array()) << r.out;
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1]["user"], "bob");
  ASSERT_EQ(coordinator_.seen().size(), 1u);
  EXPECT_EQ(coordinator_.seen()[0].query.at("all"), "1");
}

TEST_F(CliIntegrationTest, AMissingJobExits1) {
  auto r = corral({"show", "99"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "corral: no such endpoint\n");
}

}  // namespace
}  // namespace corral
