// serve_http_blocking (the connection keeper's server side) and what HttpClient sends
// again after a kept-alive connection closed: never a POST the server may have acted on.

#include "common/net/blocking_http.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/net/http_client.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::net {
namespace {

using namespace std::chrono_literals;

// A Unix socket served by serve_http_blocking, one connection at a time, on a thread.
class Served {
 public:
  Served(std::string path, std::function<HttpResponse(HttpRequest&)> handle, Duration timeout)
      : path_(std::move(path)) {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    ok_ = ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(listener_, 8) == 0;
    thread_ = std::thread([this, handle = std::move(handle), timeout] {
      for (;;) {
        int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        ++connections;
        try {
          serve_http_blocking(fd, handle, 1024, timeout);
        } catch (const std::exception&) {
          // The handler refused to answer: the connection closed unanswered.
        }
        std::lock_guard lock(mu_);
        ++ended_;
        ended_cv_.notify_all();
      }
    });
  }
  ~Served() {
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    thread_.join();
  }
  bool ok() const { return ok_; }
  // Waits until `n` connections have been served to their end.
  bool ended(int n, Duration within) {
    std::unique_lock lock(mu_);
    return ended_cv_.wait_for(lock, within, [&] { return ended_ >= n; });
  }
  std::string url() const { return "unix:" + path_; }

  std::atomic<int> connections{0};

 private:
  std::mutex mu_;
  std::condition_variable ended_cv_;
  int ended_ = 0;
  std::string path_;
  int listener_ = -1;
  bool ok_ = false;
  std::thread thread_;
};

TEST(BlockingHttp, AnswersEachRequestOfAKeptConnectionAndClosesOneIdleLongerThanItsTimeout) {
  testing::TempDir dir;
  std::mutex mu;
  std::vector<std::string> seen;
  Served server(
      dir.file("s"),
      [&](HttpRequest& req) {
        std::lock_guard lock(mu);
        seen.push_back(req.method + " " + req.target + " " + req.header("x-a") + " " + req.body);
        HttpResponse res;
        res.status = req.target == "/missing" ? 404 : 200;
        res.content_type = "text/plain";
        res.headers.emplace_back("X-B", "b");
        res.headers.emplace_back("Content-Length", "999");  // not the server's to say
        res.body = "answer to " + req.target;
        return res;
      },
      300ms);
  ASSERT_TRUE(server.ok());
  auto client = HttpClient::create(server.url(), {});
  ASSERT_TRUE(client.has_value());
  auto a = (*client)->request("GET", "/one", "", {{"X-A", "1"}});
  ASSERT_TRUE(a.has_value()) << a.error().message();
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(a->body, "answer to /one");
  EXPECT_EQ(a->content_type, "text/plain");
  bool has_b = false;
  for (const auto& [name, value] : a->headers) has_b = has_b || (name == "X-B" && value == "b");
  EXPECT_TRUE(has_b);
  auto b = (*client)->request("POST", "/missing", "{\"x\":1}");
  ASSERT_TRUE(b.has_value()) << b.error().message();
  EXPECT_EQ(b->status, 404);
  EXPECT_EQ(server.connections.load(), 1) << "the connection was not kept";
  // Idle past the timeout: the server ends the connection; the client notices before its
  // next request and connects anew.
  ASSERT_TRUE(server.ended(1, 10s)) << "an idle connection was kept past its timeout";
  auto c = (*client)->request("POST", "/three", "body");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->body, "answer to /three");
  EXPECT_EQ(server.connections.load(), 2);
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"GET /one 1 ", "POST /missing  {\"x\":1}", "POST /three  body"}));
}

TEST(BlockingHttp, ABodyOverTheLimitClosesTheConnectionUnanswered) {
  testing::TempDir dir;
  std::atomic<int> handled{0};
  Served server(
      dir.file("s"),
      [&](HttpRequest&) {
        ++handled;
        return HttpResponse{};
      },
      5s);
  ASSERT_TRUE(server.ok());
  auto client = HttpClient::create(server.url(), {});
  ASSERT_TRUE(client.has_value());
  auto r = (*client)->request("POST", "/big", std::string(4096, 'x'));
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(handled.load(), 0);
}

// A request whose sender has closed its end since (a command interrupted, or one that gave
// up waiting) is not acted on; the same request from a sender still there is.
TEST(BlockingHttp, ARequestWhoseSenderHasGoneIsNotHandled) {
  for (bool sender_gone : {true, false}) {
    int ends[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends), 0);
    const std::string request = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    ASSERT_EQ(::write(ends[0], request.data(), request.size()), static_cast<ssize_t>(request.size()));
    if (sender_gone) ::close(ends[0]);
    int handled = 0;
    serve_http_blocking(
        ends[1],
        [&](HttpRequest&) {
          ++handled;
          return HttpResponse{};
        },
        1024, 100ms);
    EXPECT_EQ(handled, sender_gone ? 0 : 1) << (sender_gone ? "acted on for a sender that had gone" : "");
    if (!sender_gone) ::close(ends[0]);
  }
}

// A kept-alive connection closed after the server read the request, before it answered:
// the server may have acted on it. A GET is sent again on a new connection; a POST is not
// (a job would be submitted twice), and the caller is told.
TEST(HttpClientResend, APostTheServerMayHaveActedOnIsNotSentAgainAGetIs) {
  testing::TempDir dir;
  std::mutex mu;
  std::vector<std::string> seen;
  std::atomic<int> drops{0};
  Served server(
      dir.file("s"),
      [&](HttpRequest& req) {
        {
          std::lock_guard lock(mu);
          seen.push_back(req.method + " " + req.target);
        }
        if (req.target.starts_with("/drop") && drops.fetch_add(1) < 2) throw std::runtime_error("dropped");
        HttpResponse res;
        res.body = "ok";
        return res;
      },
      5s);
  ASSERT_TRUE(server.ok());
  auto client = HttpClient::create(server.url(), {});
  ASSERT_TRUE(client.has_value());
  ASSERT_TRUE((*client)->request("GET", "/warm").has_value());
  auto post = (*client)->request("POST", "/drop/jobs", "{}");
  ASSERT_FALSE(post.has_value());
  EXPECT_EQ(post.error().code(), ErrorCode::Unavailable);
  EXPECT_FALSE((*client)->last_request_unsent());
  ASSERT_TRUE((*client)->request("GET", "/warm").has_value());
  auto get = (*client)->request("GET", "/drop/again");
  ASSERT_TRUE(get.has_value()) << get.error().message();
  EXPECT_EQ(get->body, "ok");
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"GET /warm", "POST /drop/jobs", "GET /warm", "GET /drop/again",
                                            "GET /drop/again"}));
}

}  // namespace
}  // namespace corral::net
