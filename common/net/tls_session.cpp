#include "common/net/tls_session.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <optional>

#include "common/core/files.hpp"

namespace corral::net {

namespace {

constexpr std::string_view kSessionMagic = "corral TLS session 2\n";
constexpr std::size_t kMaxSessionFile = 64 * 1024;
// However often it is resumed, a session stands for a verification this long at most
// (RFC 8446 4.6.1 caps a resumption chain's life); then a full handshake verifies again.

}  // namespace

std::string session_key(const std::string& url, const std::string& ca, const std::string& cert) {
  return url + " ca=" + ca + " cert=" + cert + "\n";
}

namespace {

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

}  // namespace

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

namespace {

// One DER element: where it and its contents start and end; nullopt when it runs past
// the bytes.
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

}  // namespace

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

void write_session(const std::string& path, const std::string& key, SSL_SESSION* session,
                   std::int64_t verified_at) {
  int size = i2d_SSL_SESSION(session, nullptr);
  if (size <= 0) return;
  std::string der(static_cast<std::size_t>(size), '\0');
  auto* out = reinterpret_cast<unsigned char*>(der.data());
  if (i2d_SSL_SESSION(session, &out) != size) return;
  std::string text = std::string(kSessionMagic) + key + "verified " + std::to_string(verified_at) + "\n" +
                     without_peer_certificate(std::move(der));
  // Best effort: without the file the next command makes a full handshake, nothing worse.
  // Its folder is made (the user's alone) the first time, when the settings came from the
  // environment and no config folder exists yet.
  if (write_file_atomically(path, text, 0600, Survives::kill)) return;
  const std::string folder = std::filesystem::path(path).parent_path().string();
  std::error_code ec;
  if (folder.empty() || !std::filesystem::create_directories(folder, ec)) return;
  std::filesystem::permissions(folder, std::filesystem::perms::owner_all, ec);
  (void)write_file_atomically(path, text, 0600, Survives::kill);
}

}  // namespace corral::net
