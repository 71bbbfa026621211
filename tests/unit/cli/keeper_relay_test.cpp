// The connection keeper in this process, against a real TLS server: commands on eight
// threads at once are each answered, by the server, over the keeper's kept connections;
// idle, the keeper ends and removes its socket; so does one whose server has stopped,
// within seconds. Run under ThreadSanitizer too.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
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

// A TLS echo server on a loop thread of its own, with a CA and certificate made for it.
struct TlsEchoServer {
  void start(const testing::TempDir& dir) {
    ASSERT_TRUE(net::create_ca(dir.file("ca.pem"), dir.file("ca.key"), "corral test CA").has_value());
    ASSERT_TRUE(net::issue_certificate(dir.file("ca.pem"), dir.file("ca.key"), dir.file("server.pem"),
                                       dir.file("server.key"), {"coordinator", {"127.0.0.1"}, true, false})
                    .has_value());
    net::ServerOptions opts;
    opts.host = "127.0.0.1";
    opts.tls = {dir.file("ca.pem"), dir.file("server.pem"), dir.file("server.key")};
    auto started = net::Server::start(loop, opts, echo);
    ASSERT_TRUE(started.has_value()) << started.error().message();
    server = std::move(*started);
    url = "https://127.0.0.1:" + std::to_string(server->port());
    thread = std::thread([this] { loop.run(); });
  }
  // Stops the server and its loop, and returns once the loop thread has ended.
  void stop() {
    if (!thread.joinable()) return;
    loop.post([this] {
      server->stop();
      loop.stop();
    });
    thread.join();
  }
  ~TlsEchoServer() { stop(); }

  net::EventLoop loop;
  Echo echo;
  std::unique_ptr<net::Server> server;
  std::string url;
  std::thread thread;
};

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TEST(KeeperRelay, CommandsOnEightThreadsAreEachAnsweredByTheServerAndAnIdleKeeperEnds) {
  testing::TempDir dir;
  TlsEchoServer tls;
  ASSERT_NO_FATAL_FAILURE(tls.start(dir));
  Echo& echo = tls.echo;
  const std::string url = tls.url;

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
  tls.stop();
}

// A keeper whose server has stopped (the kept connection closed, a new one refused) ends
// within seconds, not at its idle limit, and removes its socket as an idle one does.
TEST(KeeperRelay, AKeeperWhoseServerStoppedEndsWithinSecondsAndRemovesItsSocket) {
  testing::TempDir dir;
  TlsEchoServer tls;
  ASSERT_NO_FATAL_FAILURE(tls.start(dir));
  const std::string url = tls.url;

  ASSERT_EQ(::mkdir(dir.file("run").c_str(), 0700), 0);
  const std::string socket = dir.file("run/keeper");
  std::ostringstream err;
  auto keeper = std::async(std::launch::async, [&] {
    return run_keeper({"keep-connection", "--socket", socket, "--url", url, "--ca", dir.file("ca.pem")}, err);
  });
  ASSERT_TRUE(testing::eventually([&] { return exists(socket); }, 10s)) << err.str();
  {
    // A command, ended before the server stops (a command still connected is served until
    // it has been idle 15 s).
    auto c = net::HttpClient::create("unix:" + socket, {}, 10s, /*peer_is_me=*/true);
    ASSERT_TRUE(c.has_value());
    auto r = (*c)->request("GET", "/v1/jobs");
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_EQ(r->status, 200);
  }

  tls.stop();
  const auto since = std::chrono::steady_clock::now();
  ASSERT_EQ(keeper.wait_for(15s), std::future_status::ready) << "the keeper outlived its server";
  EXPECT_LT(std::chrono::steady_clock::now() - since, 8s * testing::kSanitizerSlowdown);
  EXPECT_EQ(keeper.get(), 0) << err.str();
  EXPECT_FALSE(exists(socket)) << "its socket is left";
}

// Only a refusal ends a keeper: one whose coordinator still accepts connections goes on,
// looked at again and again, until that stops.
TEST(KeeperRelay, AKeeperWhoseCoordinatorStillListensGoesOnUntilItRefuses) {
  testing::TempDir dir;
  ASSERT_TRUE(net::create_ca(dir.file("ca.pem"), dir.file("ca.key"), "corral test CA").has_value());
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string url = "https://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  ASSERT_EQ(::mkdir(dir.file("run").c_str(), 0700), 0);
  const std::string socket = dir.file("run/keeper");
  std::ostringstream err;
  auto keeper = std::async(std::launch::async, [&] {
    return run_keeper({"keep-connection", "--socket", socket, "--url", url, "--ca", dir.file("ca.pem")}, err);
  });
  // Two looks at the coordinator, each a connection accepted here.
  int looks = 0;
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  while (looks < 2 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC); fd >= 0) {
      ::close(fd);
      ++looks;
    }
  }
  ASSERT_EQ(looks, 2) << "the keeper did not look whether its coordinator is there";
  EXPECT_EQ(keeper.wait_for(0s), std::future_status::timeout) << "the keeper ended while its coordinator listened";
  EXPECT_TRUE(exists(socket));

  ::close(listener);
  ASSERT_EQ(keeper.wait_for(15s), std::future_status::ready) << "the keeper outlived its coordinator";
  EXPECT_EQ(keeper.get(), 0) << err.str();
  EXPECT_FALSE(exists(socket)) << "its socket is left";
}

}  // namespace
}  // namespace corral::cli
