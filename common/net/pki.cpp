#include "common/net/pki.hpp"

#include "common/core/files.hpp"
#include "common/core/hex.hpp"

#include <fcntl.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace corral::net {

namespace {

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using PKey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;

std::string openssl_error(std::string_view what) {
  std::string msg(what);
  unsigned long code = ERR_get_error();
  if (code != 0) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    msg += ": ";
    msg += buf;
  }
  ERR_clear_error();
  return msg;
}

Result<PKey> new_key() {
  PKey key(EVP_EC_gen("P-256"));
  if (!key) return make_error(ErrorCode::Internal, openssl_error("cannot generate an EC key"));
  return key;
}

// Replaces `path` with the PEM that `write` puts in a memory BIO, atomically (an agent
// starting while its next certificate is issued sees the old file or the new one).
template <typename Write>
Result<void> write_pem(const std::string& path, mode_t mode, const std::string& what, Write&& write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || !write(bio.get())) return make_error(ErrorCode::Internal, openssl_error("cannot encode " + what + " " + path));
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return write_file_atomically(path, std::string_view(data, static_cast<std::size_t>(size)), mode);
}

Result<void> write_key(const std::string& path, EVP_PKEY* key) {
  return write_pem(path, 0600, "key", [&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  });
}

Result<void> write_cert(const std::string& path, X509* cert) {
  return write_pem(path, 0644, "certificate", [&](BIO* b) { return PEM_write_bio_X509(b, cert) == 1; });
}

Result<Cert> read_cert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return make_error(ErrorCode::NotFound, "cannot read certificate " + path + ": " + std::strerror(errno));
  Cert cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (!cert) return make_error(ErrorCode::InvalidArgument, openssl_error("not a PEM certificate: " + path));
  return cert;
}

Result<PKey> read_key(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return make_error(ErrorCode::NotFound, "cannot read key " + path + ": " + std::strerror(errno));
  PKey key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  if (!key) return make_error(ErrorCode::InvalidArgument, openssl_error("not a PEM private key: " + path));
  return key;
}

bool add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

Result<Cert> new_cert(EVP_PKEY* key, const std::string& cn, int days) {
  Cert cert(X509_new());
  if (!cert) return make_error(ErrorCode::Internal, "X509_new failed");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("corral"), -1, -1, 0);
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1,
                                 -1, 0) != 1) {
    return make_error(ErrorCode::InvalidArgument, openssl_error("invalid common name " + cn));
  }
  return cert;
}

bool is_ip(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

}  // namespace

Result<void> create_ca(const std::string& cert_path, const std::string& key_path, const std::string& common_name,
                       int days) {
  auto key = new_key();
  if (!key) return std::unexpected(key.error());
  auto cert = new_cert(key->get(), common_name, days);
  if (!cert) return std::unexpected(cert.error());
  X509_set_issuer_name(cert->get(), X509_get_subject_name(cert->get()));
  if (!add_ext(cert->get(), cert->get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
      !add_ext(cert->get(), cert->get(), NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !add_ext(cert->get(), cert->get(), NID_subject_key_identifier, "hash")) {
    return make_error(ErrorCode::Internal, openssl_error("cannot add CA extensions"));
  }
  if (X509_sign(cert->get(), key->get(), EVP_sha256()) == 0) {
    return make_error(ErrorCode::Internal, openssl_error("cannot sign the CA certificate"));
  }
  if (auto r = write_key(key_path, key->get()); !r) return r;
  return write_cert(cert_path, cert->get());
}

Result<void> issue_certificate(const std::string& ca_cert_path, const std::string& ca_key_path,
                               const std::string& cert_path, const std::string& key_path, const CertSpec& spec) {
  if (spec.common_name.empty() || spec.common_name.size() > 64) {
    return make_error(ErrorCode::InvalidArgument, "common name must be 1 to 64 characters");
  }
  auto ca_cert = read_cert(ca_cert_path);
  if (!ca_cert) return std::unexpected(ca_cert.error());
  auto ca_key = read_key(ca_key_path);
  if (!ca_key) return std::unexpected(ca_key.error());
  auto key = new_key();
  if (!key) return std::unexpected(key.error());
  auto cert = new_cert(key->get(), spec.common_name, spec.days);
  if (!cert) return std::unexpected(cert.error());
  X509_set_issuer_name(cert->get(), X509_get_subject_name(ca_cert->get()));
  std::string eku;
  if (spec.server) eku = "serverAuth";
  if (spec.client) eku += eku.empty() ? "clientAuth" : ",clientAuth";
  bool ok = add_ext(cert->get(), ca_cert->get(), NID_basic_constraints, "critical,CA:FALSE") &&
            add_ext(cert->get(), ca_cert->get(), NID_key_usage, "critical,digitalSignature,keyEncipherment") &&
            add_ext(cert->get(), ca_cert->get(), NID_authority_key_identifier, "keyid:always");
  if (ok && !eku.empty()) ok = add_ext(cert->get(), ca_cert->get(), NID_ext_key_usage, eku);
  if (ok && !spec.subject_alt_names.empty()) {
    std::string sans;
    for (const auto& san : spec.subject_alt_names) {
      if (!sans.empty()) sans += ",";
      sans += (is_ip(san) ? "IP:" : "DNS:") + san;
    }
    ok = add_ext(cert->get(), ca_cert->get(), NID_subject_alt_name, sans);
  }
  if (!ok) return make_error(ErrorCode::InvalidArgument, openssl_error("cannot add certificate extensions"));
  if (X509_sign(cert->get(), ca_key->get(), EVP_sha256()) == 0) {
    return make_error(ErrorCode::Internal, openssl_error("cannot sign the certificate"));
  }
  if (auto r = write_key(key_path, key->get()); !r) return r;
  return write_cert(cert_path, cert->get());
}

Result<std::string> certificate_common_name(const std::string& cert_path) {
  auto cert = read_cert(cert_path);
  if (!cert) return std::unexpected(cert.error());
  char buf[256] = {};
  int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert->get()), NID_commonName, buf, sizeof(buf));
  if (n < 0) return make_error(ErrorCode::InvalidArgument, "certificate " + cert_path + " has no common name");
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string random_token() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();  // no entropy: nothing safe to do
  return hex_encode(bytes);
}

std::string sha256_hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return hex_encode(digest);
}

}  // namespace corral::net
