#pragma once
// The cluster's PKI with OpenSSL: a CA, server and agent certificates, bearer tokens
// and their hashes. Keys are written 0600. No OpenSSL type leaks out.

#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"

namespace corral::net {

struct CertSpec {
  std::string common_name;
  std::vector<std::string> subject_alt_names;  // DNS names or IP addresses
  bool server = false;                         // extendedKeyUsage serverAuth
  bool client = false;                         // extendedKeyUsage clientAuth
  int days = 825;
};

// Writes a self-signed CA certificate and its key (EC P-256).
Result<void> create_ca(const std::string& cert_path, const std::string& key_path, const std::string& common_name,
                       int days = 3650);
// Writes a certificate signed by the CA, and its new key.
Result<void> issue_certificate(const std::string& ca_cert_path, const std::string& ca_key_path,
                               const std::string& cert_path, const std::string& key_path, const CertSpec& spec);
// The subject CN of a PEM certificate file.
Result<std::string> certificate_common_name(const std::string& cert_path);

// 32 random bytes, hex: a bearer token shown once to its owner.
std::string random_token();
// Lowercase hex SHA-256; tokens are stored only as this.
std::string sha256_hex(std::string_view data);

}  // namespace corral::net
