#include "common/net/http_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <ctime>
#include <optional>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/net/tls_session.hpp"
#include "common/net/tls_util.hpp"

namespace corral::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using local = asio::local::stream_protocol;

struct HttpClient::Impl {
  asio::io_context io{1};
  std::shared_ptr<ssl::context> tls;
  Url url;
  std::string host;         // the Host header: url's host:port, or localhost on the socket
  std::string socket_path;  // a unix: URL's: plain HTTP there, no TLS
  bool peer_is_me = false;  // the socket's server must run as this user
  Duration timeout;
  ClientTls tls_files;       // its CA tells why a deferred one could not verify the server
  bool ca_deferred = false;  // the CA is read only if the kept session is not resumed
  std::string session_key;
  SessionPtr session;             // the latest session the server gave, or the one kept
  std::int64_t verified_at = 0;   // when `session`'s server was last verified
  bool session_saved = true;      // `session` is what the file holds
  std::optional<beast::ssl_stream<beast::tcp_stream>> stream;
  std::optional<beast::basic_stream<local>> local_stream;
  beast::flat_buffer buffer;

  int exchanges = 0;  // answered on the current connection
  bool unsent = false;  // the last request's failure left it unsent

  bool connected() const { return stream.has_value() || local_stream.has_value(); }
  void disconnect() {
    stream.reset();
    local_stream.reset();
    exchanges = 0;
  }

  // A kept-alive connection the server has closed (or said anything on, unasked) is seen
  // as readable before the next request is written.
  bool closed_by_server() {
    int fd = local_stream ? local_stream->socket().native_handle()
                          : beast::get_lowest_layer(*stream).socket().native_handle();
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // Runs the io_context until the operation finished; the stream's expiry bounds it.
  void run() {
    io.restart();
    io.run();
  }

  // Connected, or (on any failure) not connected at all: a failed attempt leaves no
  // half-made stream for the next request to be written on.
  Result<void> connect() {
    auto made = connect_once();
    if (!made) disconnect();
    return made;
  }

  Result<void> connect_once() {
    disconnect();
    buffer.clear();
    if (!socket_path.empty()) return connect_local();
    stream.emplace(io, *tls);
    if (!set_sni(stream->native_handle(), url.host)) {
      return make_error(ErrorCode::Internal, "cannot set TLS server name");
    }
    // A long-lived client (the connection keeper) verifies the server again a day after it
    // last did, as a later process would.
    if (session && static_cast<std::int64_t>(std::time(nullptr)) - verified_at >= kMaxVerifiedAge) session.reset();
    if (session) SSL_set_session(stream->native_handle(), session.get());
    // Verify the certificate names this host (DNS name or IP address SAN).
    stream->set_verify_callback(ssl::host_name_verification(url.host));
    tcp::resolver resolver(io);
    boost::system::error_code ec;
    auto endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
    if (ec) return make_error(ErrorCode::Unavailable, "cannot resolve " + url.host + ": " + ec.message());
    beast::get_lowest_layer(*stream).expires_after(timeout);
    beast::get_lowest_layer(*stream).async_connect(endpoints, [&ec](beast::error_code e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec) {
      return make_error(ec == beast::error::timeout ? ErrorCode::Timeout : ErrorCode::Unavailable,
                        "cannot connect to " + url.host + ":" + std::to_string(url.port) + ": " + ec.message());
    }
    // The handshake's last flight and the request go out at once, not held by Nagle for
    // an acknowledgement (up to a delayed ACK's 40 ms on a real network).
    boost::system::error_code ignored;
    beast::get_lowest_layer(*stream).socket().set_option(tcp::no_delay(true), ignored);
    stream->async_handshake(ssl::stream_base::client, [&ec](beast::error_code e) { ec = e; });
    run();
    if (ec) {
      if (ca_deferred) {
        if (auto now = make_client_tls(tls_files.ca, tls_files.cert, tls_files.key); !now) {
          return std::unexpected(now.error());
        }
      }
      return make_error(ErrorCode::Unavailable, "TLS handshake with " + url.host + ":" + std::to_string(url.port) +
                                                    " failed: " + ec.message());
    }
    return {};
  }

  // Called by OpenSSL for each session ticket the server sends (after the handshake, as
  // the response is read, in TLS 1.3); keeps the latest.
  // The context's app data is Asio's (its verify callback): the Impl has an index of its own.
  static int impl_index() {
    static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
    return index;
  }

  static int on_new_session(SSL* ssl, SSL_SESSION* s) {
    auto* self = static_cast<Impl*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), impl_index()));
    // A resumed handshake verified nothing: its tickets carry the earlier verification on.
    if (SSL_session_reused(ssl) != 1) self->verified_at = static_cast<std::int64_t>(std::time(nullptr));
    self->session.reset(s);
    self->session_saved = false;
    return 1;  // the reference is ours
  }

  void keep_sessions() {
    SSL_CTX* ctx = tls->native_handle();
    SSL_CTX_set_ex_data(ctx, impl_index(), this);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, &Impl::on_new_session);
  }

  void save_session() {
    if (session_saved || tls_files.session_file.empty() || !session) return;
    write_session(tls_files.session_file, session_key, session.get(), verified_at);
    session_saved = true;
  }

  Result<void> connect_local() {
    local_stream.emplace(io);
    boost::system::error_code ec;
    local_stream->expires_after(timeout);
    local_stream->async_connect(local::endpoint(socket_path), [&ec](beast::error_code e) { ec = e; });
    run();
    if (ec) {
      local_stream.reset();
      return make_error(ec == beast::error::timeout ? ErrorCode::Timeout : ErrorCode::Unavailable,
                        "cannot connect to the local socket " + socket_path + ": " + ec.message());
    }
    if (peer_is_me) {
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (::getsockopt(local_stream->socket().native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
          cred.uid != ::geteuid()) {
        local_stream.reset();
        return make_error(ErrorCode::PermissionDenied,
                          "the process at " + socket_path + " is not this user's (uid " + std::to_string(cred.uid) + ")");
      }
    }
    return {};
  }

  // How far a failed exchange got: whether the server may have acted on the request.
  enum class Failed { unsent, unanswered, other };

  Result<HttpResponse> exchange(http::request<http::string_body>& req, Failed& failed) {
    if (local_stream) return exchange_on(*local_stream, req, failed);
    return exchange_on(*stream, req, failed);
  }

  template <class Stream>
  Result<HttpResponse> exchange_on(Stream& on, http::request<http::string_body>& req, Failed& failed) {
    boost::system::error_code ec;
    beast::get_lowest_layer(on).expires_after(timeout);
    http::async_write(on, req, [&ec](beast::error_code e, std::size_t) { ec = e; });
    run();
    if (ec) {
      // Not all of it went out: a server acts on no request before its last byte.
      failed = ec == beast::error::timeout ? Failed::other : Failed::unsent;
      return make_error(ec == beast::error::timeout ? ErrorCode::Timeout : ErrorCode::Unavailable,
                        "cannot send request: " + ec.message());
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(256 * 1024 * 1024);
    if (req.method() == http::verb::head) parser.skip(true);
    std::size_t got = 0;
    http::async_read(on, buffer, parser, [&ec, &got](beast::error_code e, std::size_t n) {
      ec = e;
      got = n;
    });
    run();
    if (ec) {
      failed = got == 0 && ec != beast::error::timeout ? Failed::unanswered : Failed::other;
      return make_error(ec == beast::error::timeout ? ErrorCode::Timeout : ErrorCode::Unavailable,
                        "no response: " + ec.message());
    }
    auto res = parser.release();
    HttpResponse out;
    out.status = static_cast<int>(res.result_int());
    out.content_type = std::string(res[http::field::content_type]);
    out.body = std::move(res.body());
    for (const auto& field : res) out.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    if (!res.keep_alive()) disconnect();
    return out;
  }
};

void skip_tls_teardown_at_exit() {
#if !defined(__SANITIZE_ADDRESS__)
  // (With AddressSanitizer, its leak check would report what the teardown frees.)
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
#endif
}

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpClient::~HttpClient() = default;

Result<std::unique_ptr<HttpClient>> HttpClient::create(const std::string& url, ClientTls tls, Duration timeout,
                                                      bool peer_is_me) {
  if (auto path = parse_unix_url(url)) {
    if (path->size() >= sizeof(sockaddr_un{}.sun_path)) {
      return make_error(ErrorCode::InvalidArgument, "the local socket path is too long (" +
                                                        std::to_string(path->size()) + " bytes, at most " +
                                                        std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + "): " + url);
    }
    auto impl = std::make_unique<Impl>();
    impl->host = "localhost";
    impl->socket_path = *path;
    impl->peer_is_me = peer_is_me;
    impl->timeout = timeout;
    return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
  }
  auto parsed = parse_https_url(url);
  if (!parsed) {
    return make_error(ErrorCode::InvalidArgument, "not an https://host:port or unix:/path URL: " + url);
  }
  auto impl = std::make_unique<Impl>();
  if (!tls.session_file.empty()) {
    impl->session_key = session_key(url, tls.ca, tls.cert);
    auto kept = read_session(tls.session_file, impl->session_key, static_cast<std::int64_t>(std::time(nullptr)));
    impl->session = std::move(kept.session);
    impl->verified_at = kept.verified_at;
  }
  // A session to resume spares reading the CA, as it spares verifying the server.
  impl->ca_deferred = impl->session != nullptr;
  auto ctx = make_client_tls(tls.ca, tls.cert, tls.key, impl->ca_deferred ? CaLoading::when_verifying : CaLoading::now);
  if (!ctx) return std::unexpected(ctx.error());
  impl->tls = *ctx;
  impl->tls_files = std::move(tls);
  impl->url = *parsed;
  impl->host = parsed->host + ":" + std::to_string(parsed->port);
  impl->timeout = timeout;
  if (!impl->tls_files.session_file.empty()) impl->keep_sessions();
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

Result<void> HttpClient::connect() {
  if (impl_->connected()) return {};
  return impl_->connect();
}

bool HttpClient::last_request_unsent() const { return impl_->unsent; }

Result<HttpResponse> HttpClient::request(const std::string& method, const std::string& target,
                                         const std::string& body,
                                         const std::vector<std::pair<std::string, std::string>>& headers) {
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  if (req.method() == http::verb::unknown) req.method_string(method);
  req.set(http::field::host, impl_->host);
  req.set(http::field::user_agent, "corral");
  for (const auto& [name, value] : headers) req.set(name, value);
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.keep_alive(true);
  req.prepare_payload();
  // Sent again, on a new connection, only what the server cannot have acted on: a request
  // not written whole, or an idempotent one on a kept-alive connection that closed before
  // any answer. A POST that may have been acted on is not (a job would be submitted twice),
  // unless it carries an Idempotency-Key: the server answers a repeat of it with what the
  // first made.
  const bool idempotent = (req.method() != http::verb::post && req.method() != http::verb::patch) ||
                          req.find("Idempotency-Key") != req.end();
  bool maybe_seen = false;  // an attempt wrote the whole request
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (impl_->connected() && impl_->exchanges > 0 && impl_->closed_by_server()) impl_->disconnect();
    bool reused = impl_->connected() && impl_->exchanges > 0;
    impl_->unsent = !maybe_seen;
    if (!impl_->connected()) {
      if (auto c = impl_->connect(); !c) return std::unexpected(c.error());
    }
    auto failed = Impl::Failed::other;
    auto res = impl_->exchange(req, failed);
    maybe_seen = maybe_seen || res || failed != Impl::Failed::unsent;
    impl_->unsent = !maybe_seen;
    if (res) {
      ++impl_->exchanges;
      impl_->save_session();
      return res;
    }
    impl_->disconnect();
    bool resend = reused && (failed == Impl::Failed::unsent || (failed == Impl::Failed::unanswered && idempotent));
    if (!resend) return res;
  }
  return make_error(ErrorCode::Unavailable, "request failed");
}

}  // namespace corral::net
