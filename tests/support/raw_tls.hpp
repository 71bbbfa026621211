#pragma once
// A TLS client on a plain socket, for what HttpClient hides: an answer read as it arrives
// (an event stream), a connection held open, bytes sent at any moment. The server's
// certificate is not verified; these tests are about the connection, not about trust.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace corral::testing {

class RawTls {
 public:
  // `source`: the loopback address to connect from (127.0.0.1 when empty).
  explicit RawTls(int port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) return;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    ctx_ = SSL_CTX_new(TLS_client_method());
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    ok_ = SSL_connect(ssl_) == 1;
  }
  ~RawTls() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    if (fd_ >= 0) ::close(fd_);
  }
  RawTls(const RawTls&) = delete;
  RawTls& operator=(const RawTls&) = delete;

  bool ok() const { return ok_; }
  bool ended() const { return ended_; }
  // Everything the server sent so far.
  const std::string& received() const { return received_; }

  bool write(const std::string& bytes) {
    return ok_ && SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) == static_cast<int>(bytes.size());
  }

  // Reads until `text` appears after `from` in what was received; false when the server
  // closed the connection first or `limit` passed.
  bool read_until(const std::string& text, std::chrono::milliseconds limit, std::size_t from = 0) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (received_.find(text, from) == std::string::npos) {
      if (!read_some(deadline)) return false;
    }
    return true;
  }

  // Whether the server closed the connection within `limit` (reading what it sends).
  bool closed_within(std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!ended_) {
      if (!read_some(deadline)) break;
    }
    return ended_;
  }

 private:
  // One read, waiting at most until `deadline`; false at the deadline or the end.
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    if (!ok_ || ended_) return false;
    if (SSL_pending(ssl_) == 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    }
    char buf[4096];
    int n = SSL_read(ssl_, buf, sizeof(buf));
    if (n <= 0) {
      int why = SSL_get_error(ssl_, n);
      // A record not yet whole: poll again.
      if (why == SSL_ERROR_WANT_READ) return true;
      ended_ = true;
      return false;
    }
    received_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  bool ok_ = false;
  bool ended_ = false;
  std::string received_;
};

}  // namespace corral::testing
