// The connection keeper in this process, against a real TLS server: commands on eight
// threads at once are each answered, by the server, over the keeper's kept connections;
// idle, the keeper ends and removes its socket. Run under ThreadSanitizer too.

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cli/keeper.hpp"
#include "common/net/event_loop.hpp"
#include "common/net/http_client.hpp"
#include "common/net/pki.hpp"
#include "common/net/server.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::cli {
namespace {

using namespace std::chrono_literals;

class Echo final : public net::ServerHandler {
 public:
  void on_http(const net::HttpRequest& req, std::function<void(net::HttpResponse)> respond) override {
    ++requests;
    respond({200, "text/plain",
             req.method + " " + req.target + " " + req.header("authorization") + " " + req.header("idempotency-key") +
                 " " + req.body,
             {}});
  }
  Result<void> accept_ws(const net::HttpRequest&) override {
    return make_error(ErrorCode::PermissionDenied, "no WebSocket here");
  }
  void on_ws_open(const std::shared_ptr<net::WsConnection>&) override {}
  void on_ws_message(const std::shared_ptr<net::WsConnection>&, std::string) override {}
  void on_ws_close(const std::shared_ptr<net::WsConnection>&) override {}

  std::atomic<int> requests{0};  // counted on the loop thread, read by the test's
};

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TEST(KeeperRelay, CommandsOnEightThreadsAreEachAnsweredByTheServerAndAnIdleKeeperEnds) {
  testing::TempDir dir;
  ASSERT_TRUE(net::create_ca(dir.file("ca.pem"), dir.file("ca.key"), "corral test CA").has_value());
  ASSERT_TRUE(net::issue_certificate(dir.file("ca.pem"), dir.file("ca.key"), dir.file("server.pem"),
                                     dir.file("server.key"), {"coordinator", {"127.0.0.1"}, true, false})
                  .has_value());
  net::EventLoop loop;
  Echo echo;
  net::ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.tls = {dir.file("ca.pem"), dir.file("server.pem"), dir.file("server.key")};
  auto server = net::Server::start(loop, opts, echo);
  ASSERT_TRUE(server.has_value()) << server.error().message();
  std::thread loop_thread([&] { loop.run(); });
  const std::string url = "https://127.0.0.1:" + std::to_string((*server)->port());

  ASSERT_EQ(::mkdir(dir.file("run").c_str(), 0700), 0);
  const std::string socket = dir.file("run/keeper");
  std::ostringstream err;
  auto keeper = std::async(std::launch::async, [&] {
    return run_keeper({"keep-connection", "--socket", socket, "--url", url, "--ca", dir.file("ca.pem"), "--idle", "1"},
                      err);
  });
  ASSERT_TRUE(testing::eventually([&] { return exists(socket); }, 10s)) << err.str();

  constexpr int kThreads = 8;
  constexpr int kEach = 20;
  std::atomic<int> right{0};
  std::vector<std::thread> commands;
  for (int t = 0; t < kThreads; ++t) {
    commands.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // A new command each time, as each `corral` process is.
        auto c = net::HttpClient::create("unix:" + socket, {}, 10s, /*peer_is_me=*/true);
        if (!c) continue;
        std::string body = std::to_string(t) + "/" + std::to_string(i);
        // The token and a submission's key reach the coordinator as the command sent them.
        std::string key = "key-" + body;
        auto r = (*c)->request("POST", "/v1/jobs", body,
                               {{"Authorization", "Bearer t" + std::to_string(t)}, {"Idempotency-Key", key}});
        if (r && r->status == 200 && r->body == "POST /v1/jobs Bearer t" + std::to_string(t) + " " + key + " " + body) {
          ++right;
        }
      }
    });
  }
  for (auto& c : commands) c.join();
  EXPECT_EQ(right.load(), kThreads * kEach);
  EXPECT_EQ(echo.requests.load(), kThreads * kEach) << "a request was sent twice or not at all";

  ASSERT_EQ(keeper.wait_for(15s), std::future_status::ready) << "an idle keeper did not end";
  EXPECT_EQ(keeper.get(), 0) << err.str();
  EXPECT_FALSE(exists(socket)) << "its socket is left";
  loop.post([&] {
    (*server)->stop();
    loop.stop();
  });
  loop_thread.join();
}

}  // namespace
}  // namespace corral::cli
