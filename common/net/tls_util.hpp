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
// A client context that verifies the server against `ca` (and presents cert/key if set).
Result<std::shared_ptr<boost::asio::ssl::context>> make_client_tls(const std::string& ca, const std::string& cert,
                                                                   const std::string& key);
// Sets the TLS server name (SNI) a client sends; false on failure.
bool set_sni(SSL* ssl, const std::string& host);
// The CN of the peer's certificate when the CA verified it; empty otherwise.
std::string verified_peer_cn(SSL* ssl);

}  // namespace corral::net
