#pragma once
// Internal to common/net: a client's TLS session kept in a file between processes (the
// CLI's tls-session), so that the next one resumes it instead of a full handshake.
//
// The file: a line naming the format, a line naming what the session is good for
// (session_key), a line with when the server's certificate was last verified (a full
// handshake; resuming carries that time on), then the session in DER without the
// server's certificate. It is used only from a regular file of this user's that no one
// else can read or write, and only within a day of that verification.

#include <openssl/ssl.h>

#include <cstdint>
#include <memory>
#include <string>

namespace corral::net {

struct SessionFree {
  void operator()(SSL_SESSION* s) const { SSL_SESSION_free(s); }
};
using SessionPtr = std::unique_ptr<SSL_SESSION, SessionFree>;

struct KeptSession {
  SessionPtr session;            // null when there is none to resume
  std::int64_t verified_at = 0;  // seconds since the epoch
};

// How long after the server's certificate was verified a session of it may be resumed
// (a day), in a later process or the same one.
inline constexpr std::int64_t kMaxVerifiedAge = 24 * 3600;

// What a session is good for: the server's URL, the CA that verified it, and the client
// certificate it was given (if any).
std::string session_key(const std::string& url, const std::string& ca, const std::string& cert);

// The session kept at `path` for `key`, when it can still be resumed at `now`.
KeptSession read_session(const std::string& path, const std::string& key, std::int64_t now);

// Replaces the file at `path` (mode 0600) with `session`, making its folder (mode 0700)
// when missing; best effort: without the file the next process makes a full handshake.
void write_session(const std::string& path, const std::string& key, SSL_SESSION* session, std::int64_t verified_at);

// `der` (an SSL_SESSION as i2d_SSL_SESSION writes it) without the server's certificate,
// OpenSSL's SSL_SESSION_ASN1 field [3], which resumption does not use but whose decoding
// would cost the next process 7 M instructions, more than resuming saves. Unchanged when
// it is not laid out as expected.
std::string without_peer_certificate(std::string der);

}  // namespace corral::net
