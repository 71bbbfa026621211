#include "common/net/http_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <charconv>
#include <ctime>
#include <optional>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/core/files.hpp"
#include "common/net/tls_util.hpp"

namespace corral::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using local = asio::local::stream_protocol;

namespace {

struct SessionFree {
  void operator()(SSL_SESSION* s) const { SSL_SESSION_free(s); }
};
using SessionPtr = std::unique_ptr<SSL_SESSION, SessionFree>;

// A session file: a first line naming the format, a second naming what the session is
// good for (the URL, CA and client certificate), a third when the server's certificate
// was last verified (a full handshake; resuming carries that time on), then the session
// in DER.
constexpr std::string_view kSessionMagic = "corral TLS session 2\n";
constexpr std::size_t kMaxSessionFile = 64 * 1024;
// However often it is resumed, a session stands for a verification this long at most
// (RFC 8446 4.6.1 caps a resumption chain's life); then a full handshake verifies again.
constexpr std::int64_t kMaxVerifiedAge = 24 * 3600;

std::string session_key(const std::string& url, const ClientTls& tls) {
  return url + " ca=" + tls.ca + " cert=" + tls.cert + "\n";
}

struct KeptSession {
  SessionPtr session;
  std::int64_t verified_at = 0;  // seconds since the epoch
};

// The file's bytes, when it is a regular file of this user's that nobody else can read
// or write: a session stands for the server's verified identity, so one planted by
// someone else (or readable by them) is not used.
std::optional<std::string> read_own_private_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::optional<std::string> text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0 &&
      st.st_size <= static_cast<off_t>(kMaxSessionFile)) {
    text.emplace(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t done = 0;
    while (done < text->size()) {
      ssize_t n = ::read(fd, text->data() + done, text->size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    text->resize(done);
  }
  ::close(fd);
  return text;
}

// The kept session when it is for `key` and can still be resumed; empty otherwise.
KeptSession read_session(const std::string& path, const std::string& key, std::int64_t now) {
  auto text = read_own_private_file(path);
  std::string header = std::string(kSessionMagic) + key + "verified ";
  if (!text || !text->starts_with(header)) return {};
  std::size_t line_end = text->find('\n', header.size());
  if (line_end == std::string::npos) return {};
  std::int64_t verified_at = 0;
  auto [end, err] = std::from_chars(text->data() + header.size(), text->data() + line_end, verified_at);
  if (err != std::errc() || end != text->data() + line_end || verified_at > now || now - verified_at >= kMaxVerifiedAge) {
    return {};
  }
  const auto* der = reinterpret_cast<const unsigned char*>(text->data() + line_end + 1);
  SessionPtr session(d2i_SSL_SESSION(nullptr, &der, static_cast<long>(text->size() - line_end - 1)));
  if (!session || SSL_SESSION_is_resumable(session.get()) != 1) return {};
  // A ticket past its lifetime would be offered and refused: not worth sending.
  if (SSL_SESSION_get_time(session.get()) + SSL_SESSION_get_timeout(session.get()) <= now) return {};
  return {std::move(session), verified_at};
}

// One DER element: where its contents start and end. nullopt when it runs past `end`.
struct DerElement {
  unsigned char tag = 0;
  std::size_t begin = 0;    // of the element (its tag)
  std::size_t content = 0;  // of its contents
  std::size_t end = 0;      // one past its contents
};

std::optional<DerElement> der_element(std::string_view der, std::size_t at) {
  if (at + 2 > der.size()) return std::nullopt;
  DerElement e{static_cast<unsigned char>(der[at]), at, at + 2, 0};
  std::size_t length = static_cast<unsigned char>(der[at + 1]);
  if (length & 0x80) {
    std::size_t bytes = length & 0x7f;
    if (bytes == 0 || bytes > 3 || at + 2 + bytes > der.size()) return std::nullopt;
    length = 0;
    for (std::size_t i = 0; i < bytes; ++i) length = (length << 8) | static_cast<unsigned char>(der[at + 2 + i]);
    e.content += bytes;
  }
  e.end = e.content + length;
  if (e.end > der.size()) return std::nullopt;
  return e;
}

std::string der_length(std::size_t n) {
  if (n < 0x80) return std::string(1, static_cast<char>(n));
  std::string bytes;
  for (; n > 0; n >>= 8) bytes.insert(bytes.begin(), static_cast<char>(n & 0xff));
  return static_cast<char>(0x80 | bytes.size()) + bytes;
}

// The session without the server's certificate (OpenSSL's SSL_SESSION_ASN1 field [3]),
// which resumption does not use but whose decoding would cost the next command 7 M
// instructions, more than resuming saves. Unchanged when it is not laid out as expected.
std::string without_peer_certificate(std::string der) {
  auto outer = der_element(der, 0);
  if (!outer || outer->tag != 0x30 || outer->end != der.size()) return der;
  std::string fields;
  for (std::size_t at = outer->content; at < outer->end;) {
    auto field = der_element(der, at);
    if (!field) return der;
    if (field->tag != 0xa3) fields.append(der, field->begin, field->end - field->begin);
    at = field->end;
  }
  return "\x30" + der_length(fields.size()) + fields;
}

void write_session(const std::string& path, const std::string& key, SSL_SESSION* session, std::int64_t verified_at) {
  int size = i2d_SSL_SESSION(session, nullptr);
  if (size <= 0) return;
  std::string der(static_cast<std::size_t>(size), '\0');
  auto* out = reinterpret_cast<unsigned char*>(der.data());
  if (i2d_SSL_SESSION(session, &out) != size) return;
  std::string text = std::string(kSessionMagic) + key + "verified " + std::to_string(verified_at) + "\n" +
                     without_peer_certificate(std::move(der));
  // Best effort: without the file the next command makes a full handshake, nothing worse.
  (void)write_file_atomically(path, text, 0600, Survives::kill);
}

}  // namespace

struct HttpClient::Impl {
  asio::io_context io{1};
  std::shared_ptr<ssl::context> tls;
  Url url;
  std::string host;         // the Host header: url's host:port, or localhost on the socket
  std::string socket_path;  // a unix: URL's: plain HTTP there, no TLS
  Duration timeout;
  ClientTls tls_files;       // to tell why a deferred CA could not verify the server
  bool ca_deferred = false;  // the CA is read only if the kept session is not resumed
  std::string session_file;  // ClientTls::session_file
  std::string session_key;
  SessionPtr session;             // the latest session the server gave, or the one kept
  std::int64_t verified_at = 0;   // when `session`'s server was last verified
  bool session_saved = true;      // `session` is what the file holds
  std::optional<beast::ssl_stream<beast::tcp_stream>> stream;
  std::optional<beast::basic_stream<local>> local_stream;
  beast::flat_buffer buffer;

  bool connected() const { return stream.has_value() || local_stream.has_value(); }
  void disconnect() {
    stream.reset();
    local_stream.reset();
  }

  // Runs the io_context until the operation finished; the stream's expiry bounds it.
  void run() {
    io.restart();
    io.run();
  }

  Result<void> connect() {
    disconnect();
    buffer.clear();
    if (!socket_path.empty()) return connect_local();
    stream.emplace(io, *tls);
    if (!set_sni(stream->native_handle(), url.host)) {
      return make_error(ErrorCode::Internal, "cannot set TLS server name");
    }
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
    if (session_saved || session_file.empty() || !session) return;
    write_session(session_file, session_key, session.get(), verified_at);
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
    return {};
  }

  Result<HttpResponse> exchange(http::request<http::string_body>& req, bool& retryable) {
    if (local_stream) return exchange_on(*local_stream, req, retryable);
    return exchange_on(*stream, req, retryable);
  }

  template <class Stream>
  Result<HttpResponse> exchange_on(Stream& on, http::request<http::string_body>& req, bool& retryable) {
    boost::system::error_code ec;
    beast::get_lowest_layer(on).expires_after(timeout);
    http::async_write(on, req, [&ec](beast::error_code e, std::size_t) { ec = e; });
    run();
    if (ec) {
      retryable = true;
      return make_error(ErrorCode::Unavailable, "cannot send request: " + ec.message());
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(256 * 1024 * 1024);
    std::size_t got = 0;
    http::async_read(on, buffer, parser, [&ec, &got](beast::error_code e, std::size_t n) {
      ec = e;
      got = n;
    });
    run();
    if (ec) {
      // A kept-alive connection the server closed fails on the first read: try once more.
      retryable = got == 0 && ec != beast::error::timeout;
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

Result<std::unique_ptr<HttpClient>> HttpClient::create(const std::string& url, ClientTls tls, Duration timeout) {
  if (auto path = parse_unix_url(url)) {
    if (path->size() >= sizeof(sockaddr_un{}.sun_path)) {
      return make_error(ErrorCode::InvalidArgument, "the local socket path is too long (" +
                                                        std::to_string(path->size()) + " bytes, at most " +
                                                        std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + "): " + url);
    }
    auto impl = std::make_unique<Impl>();
    impl->host = "localhost";
    impl->socket_path = *path;
    impl->timeout = timeout;
    return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
  }
  auto parsed = parse_https_url(url);
  if (!parsed) {
    return make_error(ErrorCode::InvalidArgument, "not an https://host:port or unix:/path URL: " + url);
  }
  auto impl = std::make_unique<Impl>();
  if (!tls.session_file.empty()) {
    impl->session_file = tls.session_file;
    impl->session_key = session_key(url, tls);
    auto kept = read_session(impl->session_file, impl->session_key, static_cast<std::int64_t>(std::time(nullptr)));
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
  if (!impl->session_file.empty()) impl->keep_sessions();
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

Result<HttpResponse> HttpClient::request(const std::string& method, const std::string& target,
                                         const std::string& body,
                                         const std::vector<std::pair<std::string, std::string>>& headers) {
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, impl_->host);
  req.set(http::field::user_agent, "corral");
  for (const auto& [name, value] : headers) req.set(name, value);
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.keep_alive(true);
  req.prepare_payload();
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool reused = impl_->connected();
    if (!reused) {
      if (auto c = impl_->connect(); !c) return std::unexpected(c.error());
    }
    bool retryable = false;
    auto res = impl_->exchange(req, retryable);
    if (res) {
      impl_->save_session();
      return res;
    }
    impl_->disconnect();
    if (!(reused && retryable)) return res;
  }
  return make_error(ErrorCode::Unavailable, "request failed");
}

}  // namespace corral::net
