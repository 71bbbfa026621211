#pragma once
// Internal to common/net: TLS contexts and peer identity. Never include outside common/net.

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <string>

#include "common/core/error.hpp"

namespace corral::net {

// A server context; with a CA it asks clients for a certificate and verifies any it gets.
Result<std::shared_ptr<boost::asio::ssl::context>> make_server_tls(const std::string& ca, const std::string& cert,
                                                                   const std::string& key);
// When a client context reads its CA: now, or only once a certificate must be verified,
// which a resumed session never needs (the file is still checked to be readable now).
enum class CaLoading { now, when_verifying };

// A client context that verifies the server against `ca` (and presents cert/key if set).
// With CaLoading::when_verifying a CA that turns out unusable fails the handshake's
// verification; make_client_tls(..., now) then tells why.
Result<std::shared_ptr<boost::asio::ssl::context>> make_client_tls(const std::string& ca, const std::string& cert,
                                                                   const std::string& key,
                                                                   CaLoading loading = CaLoading::now);
// Sets the TLS server name (SNI) a client sends; false on failure.
bool set_sni(SSL* ssl, const std::string& host);
// The CN of the peer's certificate when the CA verified it; empty otherwise.
std::string verified_peer_cn(SSL* ssl);

}  // namespace corral::net
