#include "common/net/tls_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <boost/asio/ssl.hpp>

namespace corral::net {

namespace ssl = boost::asio::ssl;

namespace {
constexpr auto kOptions = ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                          ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use;

// "cannot load CA /etc/corral/ca.pem: No such file or directory": OpenSSL says only
// "asio.ssl error" for a file it could not open, so that case is told apart first.
Error load_error(std::string_view what, const std::string& path, const boost::system::error_code& ec) {
  std::string why;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why = std::strerror(errno);
  } else {
    ::close(fd);
    why = "not a usable PEM file (" + ec.message() + ")";
  }
  return Error(ErrorCode::InvalidArgument, "cannot load " + std::string(what) + " " + path + ": " + why);
}

// Stands in for X509_verify_cert: reads the CA into the context's store the first time a
// certificate must be verified, then verifies as usual. `arg` is the CA's path, which the
// context's deleter keeps alive.
int verify_loading_ca(X509_STORE_CTX* store_ctx, void* arg) {
  X509_STORE* store = X509_STORE_CTX_get0_store(store_ctx);
  // Every certificate in the store came from this file, so an empty store means unread.
  STACK_OF(X509_OBJECT)* objects = X509_STORE_get0_objects(store);
  if (objects == nullptr || sk_X509_OBJECT_num(objects) == 0) {
    if (X509_STORE_load_file(store, static_cast<const std::string*>(arg)->c_str()) != 1) {
      X509_STORE_CTX_set_error(store_ctx, X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);
      return 0;
    }
  }
  return X509_verify_cert(store_ctx);
}
}

Result<std::shared_ptr<ssl::context>> make_server_tls(const std::string& ca, const std::string& cert,
                                                      const std::string& key) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  ctx->set_options(kOptions, ec);
  // An idle connection (an agent between heartbeats, hundreds of waiting clients) gives
  // its read and write buffers back.
  SSL_CTX_set_mode(ctx->native_handle(), SSL_MODE_RELEASE_BUFFERS);
  // The certificate file's own chain and nothing more: OpenSSL would otherwise append the
  // CA from the store that verifies agents, which every peer already holds and would
  // decode for nothing (6 % of a `corral submit`'s instructions).
  SSL_CTX_set_mode(ctx->native_handle(), SSL_MODE_NO_AUTO_CHAIN);
  // One session ticket per handshake (OpenSSL sends two): the CLI keeps only the latest,
  // agents none. It can be resumed for a day, a person's working day of commands; the
  // ticket key is this process's, so a restart ends every session. Tickets carry the
  // session, so the server keeps no cache of them: memory does not grow with clients.
  SSL_CTX_set_session_cache_mode(ctx->native_handle(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx->native_handle(), 1);
  SSL_CTX_set_timeout(ctx->native_handle(), 24 * 3600);
  if (ctx->use_certificate_chain_file(cert, ec); ec) {
    return std::unexpected(load_error("certificate", cert, ec));
  }
  if (ctx->use_private_key_file(key, ssl::context::pem, ec); ec) {
    return std::unexpected(load_error("key", key, ec));
  }
  if (!ca.empty()) {
    if (ctx->load_verify_file(ca, ec); ec) {
      return std::unexpected(load_error("CA", ca, ec));
    }
    // Ask for a client certificate; people's clients have none and that is fine, but a
    // certificate that does not verify fails the handshake.
    ctx->set_verify_mode(ssl::verify_peer, ec);
    // Session resumption would need a session id context once verification is on.
    static const unsigned char kSid[] = "corral";
    SSL_CTX_set_session_id_context(ctx->native_handle(), kSid, sizeof(kSid) - 1);
  }
  return ctx;
}

Result<std::shared_ptr<ssl::context>> make_client_tls(const std::string& ca, const std::string& cert,
                                                      const std::string& key, CaLoading loading) {
  if (ca.empty()) return make_error(ErrorCode::InvalidArgument, "no CA file given to verify the coordinator");
  std::shared_ptr<ssl::context> ctx;
  boost::system::error_code ec;
  if (loading == CaLoading::now) {
    ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
    if (ctx->load_verify_file(ca, ec); ec) {
      return std::unexpected(load_error("CA", ca, ec));
    }
  } else {
    if (::access(ca.c_str(), R_OK) != 0) {
      return make_error(ErrorCode::InvalidArgument, "cannot load CA " + ca + ": " + std::strerror(errno));
    }
    auto path = std::make_shared<const std::string>(ca);
    ctx = std::shared_ptr<ssl::context>(new ssl::context(ssl::context::tls_client),
                                        [path](ssl::context* c) { delete c; });
    SSL_CTX_set_cert_verify_callback(ctx->native_handle(), verify_loading_ca,
                                     const_cast<std::string*>(path.get()));
  }
  ctx->set_options(kOptions, ec);
  ctx->set_verify_mode(ssl::verify_peer, ec);
  if (!cert.empty()) {
    if (ctx->use_certificate_chain_file(cert, ec); ec) {
      return std::unexpected(load_error("certificate", cert, ec));
    }
    if (ctx->use_private_key_file(key, ssl::context::pem, ec); ec) {
      return std::unexpected(load_error("key", key, ec));
    }
  }
  return ctx;
}

bool set_sni(SSL* ssl, const std::string& host) {
  // SSL_set_tlsext_host_name is a macro with a C cast; this is what it expands to.
  return SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, const_cast<char*>(host.c_str())) == 1;
}

std::string verified_peer_cn(SSL* ssl) {
  if (SSL_get_verify_result(ssl) != X509_V_OK) return {};
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return {};
  char buf[256] = {};
  int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof(buf));
  X509_free(cert);
  if (n <= 0) return {};
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace corral::net
