// common/net over real TLS on 127.0.0.1: HTTP, WebSocket with client certificates, and
// what a hostile or broken peer does to the server.

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <openssl/ssl.h>
#include <sys/time.h>
#include <poll.h>

#include <sys/stat.h>
#include <sys/un.h>
#include <sys/uio.h>
#include <cstring>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/net/http_client.hpp"
#include "common/net/pki.hpp"
#include "common/net/server.hpp"
#include "common/net/tls_session.hpp"
#include "common/net/ws_client.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/raw_tls.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::net {
namespace {

using namespace std::chrono_literals;

class EchoHandler : public ServerHandler {
 public:
  void on_http(const HttpRequest& req, std::function<void(HttpResponse)> respond) override {
    last = req;
    if (req.path == "/denied") return respond({401, "application/json", "{}", {}});
    if (req.path == "/events") {
      HttpResponse res{200, "text/event-stream", "retry: 1000\n\n", {}};
      res.stream = [this](std::shared_ptr<EventStream> s) { streams.push_back(std::move(s)); };
      return respond(std::move(res));
    }
    if (req.path == "/later") {
      // Answer from a later turn of the loop, as group commit does.
      pending.push_back(std::move(respond));
      pending_arrived.set_value();
      return;
    }
    respond({200, "text/plain", req.method + " " + req.path + " " + req.body + " cn=" + req.peer_cn, {}});
  }
  Result<void> accept_ws(const HttpRequest& req) override {
    if (req.peer_cn.empty()) return make_error(ErrorCode::Unauthenticated, "client certificate required");
    return {};
  }
  void on_ws_open(const std::shared_ptr<WsConnection>& c) override { opened.push_back(c->peer_cn()); }
  void on_ws_message(const std::shared_ptr<WsConnection>& c, std::string text) override {
    c->send("echo:" + text + ":" + c->peer_cn());
  }
  void on_ws_close(const std::shared_ptr<WsConnection>&) override { ++closed; }

  HttpRequest last;
  std::vector<std::shared_ptr<EventStream>> streams;  // opened event streams, on the loop
  std::vector<std::function<void(HttpResponse)>> pending;
  std::promise<void> pending_arrived;
  std::vector<std::string> opened;
  int closed = 0;
};

class NetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(create_ca(dir_.file("ca.pem"), dir_.file("ca.key"), "corral test CA").has_value());
    ASSERT_TRUE(issue_certificate(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("server.pem"),
                                  dir_.file("server.key"), {"coordinator", {"127.0.0.1", "localhost"}, true, false})
                    .has_value());
    ASSERT_TRUE(issue_certificate(dir_.file("ca.pem"), dir_.file("ca.key"), dir_.file("agent.pem"),
                                  dir_.file("agent.key"), {"gpu-a", {}, false, true})
                    .has_value());
    ServerOptions opts;
    opts.host = "127.0.0.1";
    opts.tls = {dir_.file("ca.pem"), dir_.file("server.pem"), dir_.file("server.key")};
    opts.max_body_bytes = 1024;
    configure(opts);
    auto server = Server::start(loop_, opts, handler_);
    ASSERT_TRUE(server.has_value()) << server.error().message();
    server_ = std::move(*server);
    url_ = "https://127.0.0.1:" + std::to_string(server_->port());
    thread_ = std::thread([this] { loop_.run(); });
  }
  virtual void configure(ServerOptions&) {}

  void TearDown() override {
    loop_.post([this] { server_->stop(); loop_.stop(); });
    if (thread_.joinable()) thread_.join();
  }
  std::unique_ptr<HttpClient> client(ClientTls tls) {
    auto c = HttpClient::create(url_, std::move(tls), 5s);
    EXPECT_TRUE(c.has_value());
    return std::move(*c);
  }

  testing::TempDir dir_;
  EventLoop loop_;
  EchoHandler handler_;
  std::unique_ptr<Server> server_;
  std::string url_;
  std::thread thread_;
};

TEST_F(NetTest, ServesHttpOverTlsWithKeepAlive) {
  auto c = client({dir_.file("ca.pem"), "", ""});
  for (int i = 0; i < 3; ++i) {
    auto r = c->request("POST", "/v1/x%20y?a=1", "body");
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "POST /v1/x y body cn=");
  }
}

// A client whose connection could not be made (the coordinator restarting, as `corral
// wait` rides out) connects anew at its next request, not writing on a half-made stream.
TEST_F(NetTest, AClientThatCouldNotConnectConnectsAtItsNextRequest) {
  int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ::close(probe);  // nothing listens there now
  auto c = HttpClient::create("https://127.0.0.1:" + std::to_string(port), {dir_.file("ca.pem"), "", ""}, 5s);
  ASSERT_TRUE(c.has_value());
  auto refused = (*c)->request("GET", "/hello");
  ASSERT_FALSE(refused.has_value());
  EXPECT_TRUE(refused.error().message().starts_with("cannot connect to 127.0.0.1:")) << refused.error().message();

  EventLoop loop;
  EchoHandler handler;
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = port;
  opts.tls = {dir_.file("ca.pem"), dir_.file("server.pem"), dir_.file("server.key")};
  auto later = Server::start(loop, opts, handler);
  ASSERT_TRUE(later.has_value()) << later.error().message();
  std::thread thread([&loop] { loop.run(); });
  auto r = (*c)->request("GET", "/hello");
  EXPECT_TRUE(r.has_value()) << r.error().message();
  if (r) {
    EXPECT_EQ(r->body, "GET /hello  cn=");
  }
  loop.post([&] {
    (*later)->stop();
    loop.stop();
  });
  thread.join();
}

TEST_F(NetTest, ClientCertificateCnReachesTheHandler) {
  auto c = client({dir_.file("ca.pem"), dir_.file("agent.pem"), dir_.file("agent.key")});
  auto r = c->request("GET", "/whoami");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /whoami  cn=gpu-a");
}

TEST_F(NetTest, RespondingLaterStillAnswers) {
  auto c = client({dir_.file("ca.pem"), "", ""});
  std::thread later([this] {
    handler_.pending_arrived.get_future().wait();
    loop_.post([this] { handler_.pending.front()({202, "text/plain", "done", {}}); });
  });
  auto r = c->request("GET", "/later");
  later.join();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 202);
}

// `n` requests to send in one write, as a pipelining client does: GET /p/0, /p/1, ...,
// with a POST and its body in the middle; the last one asks to close the connection when
// `close_after` (so that a reader may read until the end).
std::string pipelined_requests(int n, bool close_after = false) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string path = "/p/" + std::to_string(i);
    if (i == n / 2) {
      out += "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody";
    } else {
      out += "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + (close_after && i == n - 1 ? "Connection: close\r\n" : "") +
             "\r\n";
    }
  }
  return out;
}

// What EchoHandler answers to pipelined_requests(n), in order.
std::vector<std::string> pipelined_answers(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string path = "/p/" + std::to_string(i);
    out.push_back(i == n / 2 ? "POST " + path + " body cn=" : "GET " + path + "  cn=");
  }
  return out;
}

// The bodies of the HTTP answers in `bytes`, in the order they came, each framed by its
// Content-Length; stops at the first that is not whole.
std::vector<std::string> answer_bodies(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (;;) {
    std::size_t head_end = bytes.find("\r\n\r\n", at);
    if (head_end == std::string::npos) break;
    std::size_t length_at = bytes.find("Content-Length: ", at);
    if (length_at == std::string::npos || length_at > head_end) break;
    std::size_t length = std::stoul(bytes.substr(length_at + 16, head_end - length_at - 16));
    if (head_end + 4 + length > bytes.size()) break;
    out.push_back(bytes.substr(head_end + 4, length));
    at = head_end + 4 + length;
  }
  return out;
}

TEST_F(NetTest, PipelinedRequestsAreEachAnsweredInTheOrderSent) {
  constexpr int kRequests = 200;
  testing::RawTls c(server_->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.write(pipelined_requests(kRequests)));
  EXPECT_TRUE(c.read_until(pipelined_answers(kRequests).back(), 10s))
      << answer_bodies(c.received()).size() << " answers came";
  EXPECT_EQ(answer_bodies(c.received()), pipelined_answers(kRequests));
  // And the connection is kept for more.
  ASSERT_TRUE(c.write("GET /more HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(c.read_until("GET /more  cn=", 5s));
}

TEST_F(NetTest, AnAnswerGivenLaterComesBeforeThatOfTheRequestPipelinedBehindIt) {
  testing::RawTls c(server_->port());
  ASSERT_TRUE(c.ok());
  auto arrived = handler_.pending_arrived.get_future();
  ASSERT_TRUE(c.write("GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /behind HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_EQ(arrived.wait_for(5s), std::future_status::ready);
  // The request behind it waits, unread, until this one is answered.
  std::promise<std::string> last;
  loop_.post([&] { last.set_value(handler_.last.path); });
  EXPECT_EQ(last.get_future().get(), "/later");
  loop_.post([this] { handler_.pending.front()({202, "text/plain", "done", {}}); });
  EXPECT_TRUE(c.read_until("GET /behind  cn=", 5s));
  EXPECT_EQ(answer_bodies(c.received()), (std::vector<std::string>{"done", "GET /behind  cn="}));
}

TEST_F(NetTest, RefusesAServerCertificateFromAnotherCa) {
  ASSERT_TRUE(create_ca(dir_.file("other.pem"), dir_.file("other.key"), "someone else").has_value());
  auto c = client({dir_.file("other.pem"), "", ""});
  auto r = c->request("GET", "/");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Unavailable);
}

TEST_F(NetTest, ACaThatCannotBeLoadedSaysWhy) {
  auto missing = HttpClient::create(url_, {"/nonexistent/corral-ca.pem", "", ""}, 5s);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().message(), "cannot load CA /nonexistent/corral-ca.pem: No such file or directory");
  std::ofstream(dir_.file("junk.pem")) << "not a certificate\n";
  auto junk = HttpClient::create(url_, {dir_.file("junk.pem"), "", ""}, 5s);
  ASSERT_FALSE(junk.has_value());
  EXPECT_TRUE(junk.error().message().starts_with("cannot load CA " + dir_.file("junk.pem") + ": not a usable PEM file"))
      << junk.error().message();
}

TEST_F(NetTest, RefusesAClientCertificateFromAnotherCa) {
  ASSERT_TRUE(create_ca(dir_.file("other.pem"), dir_.file("other.key"), "someone else").has_value());
  ASSERT_TRUE(issue_certificate(dir_.file("other.pem"), dir_.file("other.key"), dir_.file("rogue.pem"),
                                dir_.file("rogue.key"), {"gpu-a", {}, false, true})
                  .has_value());
  auto c = client({dir_.file("ca.pem"), dir_.file("rogue.pem"), dir_.file("rogue.key")});
  EXPECT_FALSE(c->request("GET", "/").has_value());
  // And the server still serves others.
  auto ok = client({dir_.file("ca.pem"), "", ""})->request("GET", "/");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// As the client writes a session file: this user's, mode 0600.
void write_private(const std::string& path, const std::string& text) {
  std::filesystem::remove(path);
  write_all(path, text);
  ::chmod(path.c_str(), 0600);
}

// A kept session file's lines: format, what it is for, when verified; then the session.
struct SessionFile {
  std::string format, key, verified, der;
  explicit SessionFile(const std::string& text) {
    std::size_t a = text.find('\n'), b = text.find('\n', a + 1), c = text.find('\n', b + 1);
    format = text.substr(0, a + 1);
    key = text.substr(a + 1, b - a);
    verified = text.substr(b + 1, c - b);
    der = text.substr(c + 1);
  }
  std::string text() const { return format + key + verified + der; }
};

class NetSessionTest : public NetTest {
 protected:
  // Replaces ca.pem with something that is no certificate: from then on only a resumed
  // session gets through, since a full handshake must read the CA.
  void break_the_ca() {
    ca_text_ = read_all(dir_.file("ca.pem"));
    write_all(dir_.file("ca.pem"), "not a certificate\n");
  }
  void mend_the_ca() { write_all(dir_.file("ca.pem"), ca_text_); }
  // Whether a new client (a new command) gets an answer, resuming or not.
  bool answered(const ClientTls& tls, const std::string& url) {
    auto c = HttpClient::create(url, tls, 5s);
    if (!c) return false;
    auto r = (*c)->request("GET", "/");
    return r.has_value() && r->status == 200;
  }

  std::string kept_ = dir_.file("tls-session");
  ClientTls tls_{.ca = dir_.file("ca.pem"), .cert = "", .key = "", .session_file = kept_};
  std::string ca_text_;
};

TEST_F(NetSessionTest, AKeptSessionIsResumedByTheNextClientWhichThenNeedsNoCa) {
  auto first = client(tls_)->request("GET", "/a");
  ASSERT_TRUE(first.has_value()) << first.error().message();
  struct stat st {};
  ASSERT_EQ(::stat(kept_.c_str(), &st), 0) << "the server's ticket was not kept";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  SessionFile file(read_all(kept_));
  EXPECT_EQ(file.format, "corral TLS session 2\n");
  EXPECT_EQ(file.key, url_ + " ca=" + dir_.file("ca.pem") + " cert=\n");
  EXPECT_TRUE(file.verified.starts_with("verified ")) << file.verified;
  // Without the server's certificate (its issuer's name would be in it), which resuming
  // does not need and which would cost the next command more to decode than it saves.
  EXPECT_EQ(file.der.find("corral test CA"), std::string::npos);

  // Twice: the ticket the resumed connection brought is kept in turn, with the time of
  // the verification it stands for carried on, not renewed.
  file.verified = "verified " + std::to_string(static_cast<long long>(std::time(nullptr)) - 100) + "\n";
  write_private(kept_, file.text());
  break_the_ca();
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(answered(tls_, url_)) << "not resumed, " << i;
  SessionFile after(read_all(kept_));
  EXPECT_NE(after.der, file.der) << "the new ticket was not kept";
  EXPECT_EQ(after.verified, file.verified);
  // Without the kept session, the same client fails on the CA at once.
  std::filesystem::remove(kept_);
  auto fresh = HttpClient::create(url_, tls_, 5s);
  ASSERT_FALSE(fresh.has_value());
  EXPECT_TRUE(fresh.error().message().starts_with("cannot load CA")) << fresh.error().message();
}

// A session stands for the server's verified identity: one that is not for this URL and
// CA, that someone else could have written or read, or whose verification is a day old
// is not offered, and the client verifies the server again (here: fails on the broken CA).
TEST_F(NetSessionTest, ASessionForAnotherUrlOrCaNotPrivateOrVerifiedADayAgoIsNotOffered) {
  ASSERT_TRUE(answered(tls_, url_));
  const SessionFile good(read_all(kept_));
  break_the_ca();
  ASSERT_TRUE(answered(tls_, url_)) << "the untouched file must resume";

  auto offered = [&](const std::string& text, mode_t mode = 0600) {
    write_private(kept_, text);
    ::chmod(kept_.c_str(), mode);
    return answered(tls_, url_);
  };
  SessionFile other = good;
  other.key = "https://127.0.0.1:1 ca=" + dir_.file("ca.pem") + " cert=\n";
  EXPECT_FALSE(offered(other.text())) << "another URL's";
  other = good;
  other.key = url_ + " ca=" + dir_.file("other-ca.pem") + " cert=\n";
  EXPECT_FALSE(offered(other.text())) << "another CA's";
  EXPECT_FALSE(offered(good.text(), 0644)) << "readable by others";
  EXPECT_FALSE(offered(good.text(), 0620)) << "writable by the group";
  other = good;
  auto now = static_cast<long long>(std::time(nullptr));
  other.verified = "verified " + std::to_string(now - 24 * 3600 - 5) + "\n";
  EXPECT_FALSE(offered(other.text())) << "verified over a day ago";
  other.verified = "verified " + std::to_string(now + 3600) + "\n";
  EXPECT_FALSE(offered(other.text())) << "verified in the future";
  other.verified = "verified soon\n";
  EXPECT_FALSE(offered(other.text())) << "no time";
  other = good;
  other.der = "garbage";
  EXPECT_FALSE(offered(other.text())) << "garbled";
  // A link to a good file is not followed.
  write_private(dir_.file("elsewhere"), good.text());
  std::filesystem::remove(kept_);
  std::filesystem::create_symlink(dir_.file("elsewhere"), kept_);
  EXPECT_FALSE(answered(tls_, url_)) << "through a link";
  // And the good one, restored, still is.
  std::filesystem::remove(kept_);
  other = good;
  other.verified = "verified " + std::to_string(now - 24 * 3600 + 60) + "\n";
  EXPECT_TRUE(offered(other.text())) << "verified just under a day ago";
  mend_the_ca();
}

// DER element: tag, length (short or long form), contents.
std::string der(unsigned char tag, const std::string& contents) {
  std::string out(1, static_cast<char>(tag));
  std::size_t n = contents.size();
  if (n < 0x80) {
    out += static_cast<char>(n);
  } else if (n < 0x100) {
    out += "\x81";
    out += static_cast<char>(n);
  } else {
    out += "\x82";
    out += static_cast<char>(n >> 8);
    out += static_cast<char>(n & 0xff);
  }
  return out + contents;
}

TEST(TlsSessionFile, OnlyTheTopLevelPeerCertificateFieldIsLeftOut) {
  const std::string version = der(0x02, "\x01");
  const std::string master = der(0x04, std::string(200, 'k'));          // a long-form length
  const std::string inner_three = der(0x30, der(0xa3, "nested"));      // not at the top: kept
  const std::string peer = der(0xa3, der(0x30, std::string(300, 'c')));  // the certificate
  const std::string after = der(0xa4, der(0x02, "\x05"));
  EXPECT_EQ(without_peer_certificate(der(0x30, version + master + peer + inner_three + after)),
            der(0x30, version + master + inner_three + after));
  // Nothing to leave out: the same bytes.
  const std::string plain = der(0x30, version + master + after);
  EXPECT_EQ(without_peer_certificate(plain), plain);
  // Not laid out as expected: unchanged, so OpenSSL alone decides what it is.
  for (const std::string& odd : {std::string(), std::string("\x30"), plain.substr(0, plain.size() - 1),
                                 plain + "x", der(0x31, version + peer), der(0x30, version + "\x04\x85")}) {
    EXPECT_EQ(without_peer_certificate(odd), odd);
  }
}

// A coordinator restarted since the ticket was kept cannot open it: the client falls back
// to a full handshake, reading the CA it had put off, and says why when the CA is unusable.
TEST_F(NetSessionTest, ATicketTheServerCannotOpenFallsBackToAFullHandshakeWithTheCa) {
  ASSERT_TRUE(answered(tls_, url_));

  EventLoop loop;
  EchoHandler handler;
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.tls = {dir_.file("ca.pem"), dir_.file("server.pem"), dir_.file("server.key")};
  auto restarted = Server::start(loop, opts, handler);
  ASSERT_TRUE(restarted.has_value()) << restarted.error().message();
  std::thread thread([&loop] { loop.run(); });
  std::string url = "https://127.0.0.1:" + std::to_string((*restarted)->port());
  // The same session, named for the restarted server's URL.
  SessionFile moved(read_all(kept_));
  moved.key = url + " ca=" + dir_.file("ca.pem") + " cert=\n";
  moved.verified = "verified " + std::to_string(static_cast<long long>(std::time(nullptr)) - 100) + "\n";
  write_private(kept_, moved.text());
  EXPECT_TRUE(answered(tls_, url));
  EXPECT_NE(SessionFile(read_all(kept_)).verified, moved.verified) << "a full handshake verifies anew";

  write_private(kept_, moved.text());
  break_the_ca();
  auto broken = HttpClient::create(url, tls_, 5s);
  ASSERT_TRUE(broken.has_value()) << "the CA is read only if the session is not resumed";
  auto failed = (*broken)->request("GET", "/");
  ASSERT_FALSE(failed.has_value());
  EXPECT_TRUE(failed.error().message().starts_with("cannot load CA " + dir_.file("ca.pem") + ": not a usable PEM file"))
      << failed.error().message();
  mend_the_ca();

  loop.post([&] { (*restarted)->stop(); loop.stop(); });
  thread.join();
}

// Sends `request` over TLS and keeps its own side open; how long the server took to close
// the connection (at most `limit`, then nullopt).
std::optional<std::chrono::milliseconds> time_until_closed(int port, const std::string& request,
                                                           std::chrono::milliseconds limit) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return std::nullopt;
  timeval tv{static_cast<time_t>(limit.count() / 1000), static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::optional<std::chrono::milliseconds> out;
  // An empty request: the handshake only, then silence.
  if (SSL_connect(ssl) == 1 &&
      (request.empty() || SSL_write(ssl, request.data(), static_cast<int>(request.size())) > 0)) {
    auto start = std::chrono::steady_clock::now();
    char buf[4096];
    while (SSL_read(ssl, buf, sizeof(buf)) > 0) {
    }
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (took < limit) out = took;
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ::close(fd);
  return out;
}

TEST_F(NetTest, AConnectionRefusedWith401Or413IsClosedAtOnceNotKeptIdle) {
  // Idle keep-alive would hold it 120 s, a read in progress 30 s.
  auto denied = time_until_closed(server_->port(), "GET /denied HTTP/1.1\r\nHost: x\r\n\r\n", 10s);
  ASSERT_TRUE(denied.has_value()) << "a 401 kept its connection";
  EXPECT_LT(*denied, 1s);
  auto oversized =
      time_until_closed(server_->port(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", 10s);
  ASSERT_TRUE(oversized.has_value()) << "a 413 whose client sends nothing more kept its connection";
  EXPECT_LT(*oversized, 4s);
  auto ok = client({dir_.file("ca.pem"), "", ""})->request("GET", "/");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
}

TEST_F(NetTest, OversizedBodyIs413AndTheServerKeepsServing) {
  auto c = client({dir_.file("ca.pem"), "", ""});
  auto r = c->request("POST", "/", std::string(4096, 'x'));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  auto again = client({dir_.file("ca.pem"), "", ""})->request("GET", "/");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->status, 200);
}

TEST_F(NetTest, PlainTextGarbageIsDroppedAndTheServerKeepsServing) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_GT(::write(fd, junk, sizeof(junk)), 0);
  char buf[64];
  // The server ends the connection: read returns 0 or an error, not a hang.
  EXPECT_LE(::read(fd, buf, sizeof(buf)), 0);
  ::close(fd);
  auto ok = client({dir_.file("ca.pem"), "", ""})->request("GET", "/");
  ASSERT_TRUE(ok.has_value());
}

TEST_F(NetTest, WebSocketNeedsAClientCertificateAndEchoesWithIt) {
  // Without a certificate: refused with 401.
  auto refused = client({dir_.file("ca.pem"), "", ""})
                     ->request("GET", "/v1/agent", "",
                               {{"Connection", "Upgrade"},
                                {"Upgrade", "websocket"},
                                {"Sec-WebSocket-Version", "13"},
                                {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}});
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 401);

  EventLoop client_loop;
  std::vector<std::string> got;
  std::string closed_reason;
  WsClientOptions opts;
  opts.url = url_;
  opts.tls = {dir_.file("ca.pem"), dir_.file("agent.pem"), dir_.file("agent.key")};
  WsClient* ws_ptr = nullptr;
  WsClient ws(client_loop, opts,
              {[&] { ws_ptr->send("hello"); },
               [&](std::string m) {
                 got.push_back(std::move(m));
                 ws_ptr->close();
                 client_loop.stop();
               },
               [&](std::string reason) {
                 closed_reason = std::move(reason);
                 client_loop.stop();
               }});
  ws_ptr = &ws;
  ws.connect();
  client_loop.run();
  ASSERT_EQ(got.size(), 1u) << closed_reason;
  EXPECT_EQ(got[0], "echo:hello:gpu-a");
}

TEST_F(NetTest, AnAgentLinkWithACertificateFromAnotherCaFailsSayingWhyNotWithAStatusNeverSent) {
  // With TLS 1.3 the client's handshake is done before the server judged its certificate:
  // the verdict comes as an alert on the first read, the WebSocket upgrade's.
  ASSERT_TRUE(create_ca(dir_.file("other.pem"), dir_.file("other.key"), "someone else").has_value());
  ASSERT_TRUE(issue_certificate(dir_.file("other.pem"), dir_.file("other.key"), dir_.file("rogue.pem"),
                                dir_.file("rogue.key"), {"gpu-a", {}, false, true})
                  .has_value());
  EventLoop client_loop;
  bool opened = false;
  std::string closed_reason;
  WsClientOptions opts;
  opts.url = url_;
  opts.tls = {dir_.file("ca.pem"), dir_.file("rogue.pem"), dir_.file("rogue.key")};
  WsClient ws(client_loop, opts,
              {[&] {
                 opened = true;
                 client_loop.stop();
               },
               [](std::string) {},
               [&](std::string reason) {
                 closed_reason = std::move(reason);
                 client_loop.stop();
               }});
  ws.connect();
  client_loop.run();
  EXPECT_FALSE(opened);
  EXPECT_EQ(closed_reason.find("HTTP"), std::string::npos) << closed_reason;
  // "tlsv1 alert unknown ca": the coordinator does not know who issued our certificate.
  EXPECT_NE(closed_reason.find("unknown ca"), std::string::npos) << closed_reason;
}

TEST(HttpTypes, ParsesTargetsAndUrls) {
  std::string path;
  std::map<std::string, std::string> q;
  ASSERT_TRUE(parse_target("/v1/jobs?all=1&user=al%20ice", path, q));
  EXPECT_EQ(path, "/v1/jobs");
  EXPECT_EQ(q["all"], "1");
  EXPECT_EQ(q["user"], "al ice");
  EXPECT_FALSE(parse_target("/bad%zz", path, q));
  EXPECT_EQ(parse_https_url("https://10.0.0.1:7433")->port, 7433);
  EXPECT_EQ(parse_https_url("https://[::1]:7433/")->host, "::1");
  EXPECT_FALSE(parse_https_url("http://x:1").has_value());
  EXPECT_FALSE(parse_https_url("https://x:99999").has_value());
  EXPECT_EQ(parse_unix_url("unix:/run/corral/coordinator.sock"), "/run/corral/coordinator.sock");
  EXPECT_EQ(parse_unix_url("unix:///run/corral/coordinator.sock"), "/run/corral/coordinator.sock");
  EXPECT_FALSE(parse_unix_url("unix:run/x.sock").has_value());
  EXPECT_FALSE(parse_unix_url("https://x:1").has_value());
}

TEST(Pki, TokensAreRandomAndHashesStable) {
  EXPECT_NE(random_token(), random_token());
  EXPECT_EQ(random_token().size(), 64u);
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Pki, AgentCertificateCarriesTheNodeName) {
  testing::TempDir dir;
  ASSERT_TRUE(create_ca(dir.file("ca.pem"), dir.file("ca.key"), "ca").has_value());
  ASSERT_TRUE(issue_certificate(dir.file("ca.pem"), dir.file("ca.key"), dir.file("n.pem"), dir.file("n.key"),
                                {"gpu-b", {}, false, true})
                  .has_value());
  EXPECT_EQ(certificate_common_name(dir.file("n.pem")).value(), "gpu-b");
  EXPECT_EQ(std::filesystem::status(dir.file("n.key")).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// Whether the server closed `fd`, waiting up to `wait` for it to.
bool closed(int fd, std::chrono::milliseconds wait = 0ms) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// A server with room for four connections, two from one address, and deadlines short
// enough to watch.
class NetLimitsTest : public NetTest {
 protected:
  void configure(ServerOptions& opts) override {
    opts.max_connections = 4;
    opts.max_connections_per_address = 2;
    opts.handshake_timeout = 300ms;
    opts.header_timeout = 300ms;
  }

  // A TCP connection from `source` that says nothing.
  int silent(const std::string& source) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(server_->port()));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    opened_.push_back(fd);
    return fd;
  }

  // How many connections the server holds, as seen from its loop.
  std::size_t held() {
    std::promise<std::size_t> n;
    loop_.post([&] { n.set_value(server_->connections()); });
    return n.get_future().get();
  }

  void TearDown() override {
    for (int fd : opened_) ::close(fd);
    NetTest::TearDown();
  }

  std::vector<int> opened_;
};

TEST_F(NetLimitsTest, AConnectionThatSaysNothingIsClosedAtTheHandshakeDeadline) {
  int fd = silent("127.0.0.2");
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(closed(fd, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST_F(NetLimitsTest, AConnectionThatSendsNoRequestIsClosedAtTheHeaderDeadline) {
  // The TLS handshake done, then silence: 300 ms, not io_timeout's 30 s.
  auto took = time_until_closed(server_->port(), "", 5s);
  ASSERT_TRUE(took.has_value()) << "kept past 5 s";
  EXPECT_LT(*took, 2s);
}

TEST_F(NetLimitsTest, ANewcomerToAFullServerClosesTheConnectionThatWaitedLongest) {
  std::vector<int> fds;
  for (int i = 2; i < 6; ++i) fds.push_back(silent("127.0.0." + std::to_string(i)));
  ASSERT_TRUE(testing::eventually([&] { return held() == 4; }, 5s));
  auto r = client({dir_.file("ca.pem"), "", ""})->request("GET", "/");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(closed(fds[0], 1s)) << "the oldest was kept";
  for (std::size_t i = 1; i < fds.size(); ++i) EXPECT_FALSE(closed(fds[i])) << "connection " << i << " was closed";
  EXPECT_EQ(server_->evicted(), 1u);
}

TEST_F(NetLimitsTest, OneAddressCannotTakeMoreThanItsShare) {
  int other = silent("127.0.0.9");
  std::vector<int> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(silent("127.0.0.2"));
  // The third from 127.0.0.2 closed that address's oldest, and nobody else's.
  EXPECT_TRUE(closed(mine[0], 1s));
  EXPECT_FALSE(closed(mine[1]));
  EXPECT_FALSE(closed(mine[2]));
  EXPECT_FALSE(closed(other));
}

TEST_F(NetLimitsTest, AConnectionBeingAnsweredIsNeverClosedForANewcomer) {
  // Two requests the handler answers later fill 127.0.0.1's share; a third client from
  // there is refused, and each of the two still gets its answer.
  std::vector<std::future<Result<HttpResponse>>> waiting;
  std::vector<std::unique_ptr<HttpClient>> clients;
  for (int i = 0; i < 2; ++i) {
    handler_.pending_arrived = std::promise<void>();
    auto arrived = handler_.pending_arrived.get_future();
    clients.push_back(client({dir_.file("ca.pem"), "", ""}));
    waiting.push_back(std::async(std::launch::async, [c = clients.back().get()] { return c->request("GET", "/later"); }));
    ASSERT_EQ(arrived.wait_for(5s), std::future_status::ready);
  }
  auto refused = client({dir_.file("ca.pem"), "", ""})->request("GET", "/");
  EXPECT_FALSE(refused.has_value() && refused->status == 200) << "a third connection was let in";
  loop_.post([this] {
    for (auto& respond : handler_.pending) respond({200, "text/plain", "later", {}});
  });
  for (auto& w : waiting) {
    auto r = w.get();
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_GE(server_->refused(), 1u);
}

// ---------------------------------------------------------------- event streams

// The local socket: the same handler over plain HTTP on a Unix socket, for clients on the
// machine; no TLS, no WebSocket.
class NetLocalTest : public NetTest {
 protected:
  void configure(ServerOptions& opts) override { opts.local_socket = socket_; }
  std::unique_ptr<HttpClient> local_client() {
    auto c = HttpClient::create("unix:" + socket_, {}, 5s);
    EXPECT_TRUE(c.has_value()) << c.error().message();
    return std::move(*c);
  }
  static sockaddr_un unix_address(const std::string& path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
    return a;
  }
  // A socket bound at `path` by hand, listening or not (a server gone without unlinking it).
  static int bound_at(const std::string& path, bool listening) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a = unix_address(path);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || (listening && ::listen(fd, 4) != 0)) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  // Another server's options, on the local socket at `path`.
  ServerOptions options_on(const std::string& path) {
    ServerOptions opts;
    opts.host = "127.0.0.1";
    opts.tls = {dir_.file("ca.pem"), dir_.file("server.pem"), dir_.file("server.key")};
    opts.local_socket = path;
    return opts;
  }
  // A raw request on a fresh connection to the socket; what came back until it closed.
  std::string raw(const std::string& request) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a = unix_address(socket_);
    std::string got;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) got.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return got;
  }
  std::string socket_ = dir_.file("run/coordinator.sock");  // its folder made by the server
};

// Local clients' shares of the server are per user (SO_PEERCRED), not one for the machine.
class NetLocalLimitsTest : public NetLocalTest {
 protected:
  void configure(ServerOptions& opts) override {
    NetLocalTest::configure(opts);
    opts.max_connections_per_address = 2;
  }
  void TearDown() override {
    for (int fd : opened_) ::close(fd);
    NetLocalTest::TearDown();
  }

  // One byte and room for one file descriptor, as sent and received with SCM_RIGHTS.
  struct FdMessage {
    char byte = 0;
    iovec io{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    FdMessage() {
      m.msg_iov = &io;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof(control);
    }
    FdMessage(const FdMessage&) = delete;
    FdMessage& operator=(const FdMessage&) = delete;
  };

  // A connection to the socket that says nothing, made by a process running as `uid`
  // (which passes it back), so that the server sees that user as its peer.
  int silent_as(uid_t uid) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return -1;
    pid_t child = ::fork();
    if (child == 0) {
      if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(1);
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a = unix_address(socket_);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) ::_exit(2);
      FdMessage out;
      cmsghdr* c = CMSG_FIRSTHDR(&out.m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
      ::_exit(::sendmsg(pair[1], &out.m, 0) == 1 ? 0 : 3);
    }
    ::close(pair[1]);
    FdMessage in;
    int fd = -1;
    if (::recvmsg(pair[0], &in.m, 0) == 1 && CMSG_FIRSTHDR(&in.m) != nullptr) {
      std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&in.m)), sizeof(int));
    }
    ::close(pair[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not connect as " << uid;
    if (fd >= 0) opened_.push_back(fd);
    return fd;
  }

  std::vector<int> opened_;
};

TEST_F(NetLocalLimitsTest, OneUserCannotTakeAnothersShareOfTheLocalSocket) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to connect as another user";
  // Another user must reach the socket, as on a real coordinator's machine.
  std::filesystem::permissions(dir_.path(), std::filesystem::perms(0755));
  int other = silent_as(65534);
  ASSERT_GE(other, 0);
  std::vector<int> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(silent_as(0));
  // The third from root closed root's oldest, and not nobody's.
  EXPECT_TRUE(closed(mine[0], 1s));
  EXPECT_FALSE(closed(mine[1]));
  EXPECT_FALSE(closed(mine[2]));
  EXPECT_FALSE(closed(other));
}

TEST_F(NetLocalTest, ServesTheSameHandlerOverTheLocalSocketWithKeepAlive) {
  struct stat st {};
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  auto c = local_client();
  for (int i = 0; i < 3; ++i) {
    auto r = c->request("POST", "/v1/x%20y?a=1", "body");
    ASSERT_TRUE(r.has_value()) << r.error().message();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "POST /v1/x y body cn=");
  }
  std::promise<std::string> remote;
  loop_.post([&] { remote.set_value(handler_.last.remote); });
  EXPECT_EQ(remote.get_future().get(), "local uid " + std::to_string(::geteuid())) << "known by its user";
  // TLS goes on beside it.
  auto r = client({dir_.file("ca.pem"), "", ""})->request("GET", "/tls");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->body, "GET /tls  cn=");
}

TEST_F(NetLocalTest, AWebSocketUpgradeIsRefusedAndGarbageIsAnswered400) {
  std::string upgrade = raw(
      "GET /v1/agent HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
  EXPECT_TRUE(upgrade.starts_with("HTTP/1.1 400")) << upgrade;
  EXPECT_NE(upgrade.find("agents connect over TLS"), std::string::npos) << upgrade;
  EXPECT_TRUE(handler_.opened.empty());
  std::string garbage = raw("\x16\x03\x01 not http at all\r\n\r\n");
  EXPECT_TRUE(garbage.starts_with("HTTP/1.1 400")) << garbage;
  auto r = local_client()->request("GET", "/after");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(r->status, 200);
}

TEST_F(NetLocalTest, PipelinedRequestsAreEachAnsweredInTheOrderSent) {
  constexpr int kRequests = 200;
  EXPECT_EQ(answer_bodies(raw(pipelined_requests(kRequests, /*close_after=*/true))), pipelined_answers(kRequests));
}

TEST_F(NetLocalTest, AStaleSocketIsReplacedButALiveOneOrAnotherFileIsNot) {
  EventLoop other;
  ServerOptions opts = options_on(socket_);
  auto taken = Server::start(other, opts, handler_);
  ASSERT_FALSE(taken.has_value()) << "a second server took a socket the first one serves";
  EXPECT_EQ(taken.error().message(),
            "cannot listen on the local socket " + socket_ + ": another process is listening on it");
  // A socket file whose server is gone (SIGKILLed: nobody unlinked it) is taken over.
  const std::string stale = dir_.file("stale.sock");
  int fd = bound_at(stale, false);
  ASSERT_GE(fd, 0);
  ::close(fd);
  opts.local_socket = stale;
  auto replaced = Server::start(other, opts, handler_);
  ASSERT_TRUE(replaced.has_value()) << replaced.error().message();
  (*replaced)->stop();
  EXPECT_FALSE(std::filesystem::exists(stale)) << "a stopped server leaves no socket file";
  const std::string file = dir_.file("not-a-socket");
  std::ofstream(file) << "keep me";
  opts.local_socket = file;
  auto refused = Server::start(other, opts, handler_);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().message(),
            "cannot listen on the local socket " + file + ": a file that is not a socket is in the way");
  std::ifstream in(file);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "keep me");
}

// A coordinator stopping while its successor already took the path over (the file was
// unlinked and bound again) leaves the successor's socket alone.
TEST_F(NetLocalTest, AStoppingServerRemovesOnlyItsOwnSocketFile) {
  const std::string path = dir_.file("handover.sock");
  EventLoop other;
  auto first = Server::start(other, options_on(path), handler_);
  ASSERT_TRUE(first.has_value()) << first.error().message();
  ASSERT_EQ(::unlink(path.c_str()), 0);
  int successor = bound_at(path, true);
  ASSERT_GE(successor, 0);
  (*first)->stop();
  EXPECT_TRUE(std::filesystem::exists(path)) << "the successor's socket was removed";
  ::close(successor);
}

TEST_F(NetLocalTest, APathTooLongForASocketIsAnErrorNotACrash) {
  auto c = HttpClient::create("unix:/" + std::string(200, 'x'), {}, 2s);
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(c.error().message().starts_with("the local socket path is too long (201 bytes, at most 107)"))
      << c.error().message();
}

TEST_F(NetLocalTest, AClientOfAMissingSocketSaysWhichPath) {
  auto c = HttpClient::create("unix:" + dir_.file("nobody.sock"), {}, 2s);
  ASSERT_TRUE(c.has_value());
  auto r = (*c)->request("GET", "/");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Unavailable);
  EXPECT_TRUE(r.error().message().starts_with("cannot connect to the local socket " + dir_.file("nobody.sock")))
      << r.error().message();
}

class NetStreamTest : public NetTest {
 protected:
  void configure(ServerOptions& opts) override {
    opts.io_timeout = 300ms;
    opts.max_streams = 3;
    opts.max_streams_per_address = 2;
    opts.max_stream_queue_bytes = 64 * 1024;
  }

  // Runs `f` on the server's loop and waits for it.
  template <typename F>
  auto on_loop(F f) {
    std::promise<decltype(f())> done;
    loop_.post([&] {
      if constexpr (std::is_void_v<decltype(f())>) {
        f();
        done.set_value();
      } else {
        done.set_value(f());
      }
    });
    return done.get_future().get();
  }
  std::size_t open_streams() {
    return on_loop([this] {
      std::size_t n = 0;
      for (const auto& s : handler_.streams) n += s->open() ? 1 : 0;
      return n;
    });
  }
  void send_all(const std::string& event) {
    on_loop([&] {
      for (const auto& s : handler_.streams) s->send(event);
    });
  }
  static constexpr const char* kRequest = "GET /events HTTP/1.1\r\nHost: x\r\n\r\n";
};

TEST_F(NetStreamTest, AStreamCarriesEachEventAndOutlivesTheIoTimeout) {
  testing::RawTls c(server_->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.write(kRequest));
  ASSERT_TRUE(c.read_until("retry: 1000\n\n", 5s)) << c.received();
  EXPECT_NE(c.received().find("HTTP/1.1 200 OK\r\n"), std::string::npos);
  EXPECT_NE(c.received().find("Content-Type: text/event-stream\r\n"), std::string::npos);
  EXPECT_NE(c.received().find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(c.received().find("Content-Length"), std::string::npos);
  // Three io_timeouts of silence: a stream waits for events, not for the client.
  EXPECT_FALSE(c.closed_within(1s)) << "the idle stream was closed";
  send_all("data: one\n\n");
  ASSERT_TRUE(c.read_until("data: one\n\n", 5s));
  EXPECT_FALSE(c.closed_within(1s)) << "the stream was closed after a write";
  send_all("data: two\n\n");
  ASSERT_TRUE(c.read_until("data: two\n\n", 5s));
  on_loop([this] { handler_.streams.front()->close(); });
  EXPECT_TRUE(c.closed_within(5s));
}

TEST_F(NetStreamTest, AnythingTheClientSendsEndsItsStream) {
  testing::RawTls c(server_->port());
  ASSERT_TRUE(c.write(kRequest));
  ASSERT_TRUE(c.read_until("retry", 5s));
  ASSERT_EQ(open_streams(), 1u);
  ASSERT_TRUE(c.write("GET / HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(c.closed_within(5s));
  EXPECT_TRUE(testing::eventually([&] { return open_streams() == 0; }, 5s));
}

TEST_F(NetStreamTest, PastEitherStreamLimitA503AndAClosedOneFreesItsPlace) {
  auto opened = [&](testing::RawTls& c) {
    return c.write(kRequest) && c.read_until("\r\n\r\n", 5s) && c.received().starts_with("HTTP/1.1 200 OK");
  };
  auto refused = [&](testing::RawTls& c) {
    return c.write(kRequest) && c.read_until("too many event streams", 5s) && c.received().starts_with("HTTP/1.1 503");
  };
  auto a = std::make_unique<testing::RawTls>(server_->port());
  testing::RawTls b(server_->port());
  ASSERT_TRUE(opened(*a) && opened(b));
  // A third from the same address: past its share, though the server has room.
  testing::RawTls same(server_->port());
  EXPECT_TRUE(refused(same)) << same.received();
  testing::RawTls other(server_->port(), "127.0.0.2");
  EXPECT_TRUE(opened(other)) << other.received();
  // A fourth from anywhere: past the server's limit.
  testing::RawTls third(server_->port(), "127.0.0.3");
  EXPECT_TRUE(refused(third)) << third.received();
  // Plain requests are not streams and still pass.
  EXPECT_EQ(client({dir_.file("ca.pem"), "", ""})->request("GET", "/x")->status, 200);
  a.reset();  // the client leaves
  EXPECT_TRUE(testing::eventually(
      [&] {
        testing::RawTls d(server_->port());
        return opened(d);
      },
      5s));
}

TEST_F(NetStreamTest, AClientThatStopsReadingIsClosedOnceItsQueueIsFull) {
  testing::RawTls c(server_->port());
  ASSERT_TRUE(c.write(kRequest));
  ASSERT_TRUE(c.read_until("retry", 5s));
  // 16 MiB at once, more than the socket buffers and the 64 KiB queue hold; the client
  // reads none of it.
  const std::string event = "data: " + std::string(1024, 'x') + "\n\n";
  on_loop([&] {
    for (int i = 0; i < 16 * 1024; ++i) handler_.streams.front()->send(event);
  });
  EXPECT_EQ(open_streams(), 0u);
}

}  // namespace
}  // namespace corral::net
