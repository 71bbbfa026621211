#pragma once
// The connection keeper: one background process per user and coordinator that holds
// verified TLS connections to the coordinator and relays the user's commands over them,
// as ssh's ControlPersist does. A command then talks plain HTTP to the keeper over a
// Unix socket in a folder only its user can open, and pays neither OpenSSL's start-up
// nor a handshake; the coordinator sees kept-alive connections instead of one handshake
// per command.
//
// - Where: $XDG_RUNTIME_DIR/corral/, else /tmp/corral-UID/; the folder must be this
//   user's, mode 0700, not a symlink, or no keeper is used. The socket's name comes from
//   the URL, the CA file (path and identity) and corral's version.
// - Who: each side checks the other runs as the same user (SO_PEERCRED) before a byte of
//   a request (which carries the user's token) crosses.
// - When: a command that found no keeper talks TLS itself and, once the coordinator has
//   answered it, starts one (not inside a corral job, whose processes end with it). The
//   keeper ends after CORRAL_KEEP_CONNECTION seconds without a command (600 by default;
//   0 turns keepers off), when it could not get an answer from the coordinator (it answers
//   that command with the reason; the next one goes directly), or when its socket is
//   removed. It serves every command that reached it before it ends.
// - What: each request as it came (method, target, headers, body), each answer back; a
//   failure of its own comes back as HTTP 502 with X-Corral-Keeper-Error naming the error
//   code, and the message as {"error": ...}.

#include <iosfwd>
#include <string>
#include <vector>

#include "cli/connection.hpp"
#include "common/core/error.hpp"

namespace corral::cli {

// The header by which the keeper marks an answer as its own failure, not the coordinator's.
inline constexpr const char* kKeeperErrorHeader = "X-Corral-Keeper-Error";

struct KeeperUse {
  std::string dir;        // the private folder of keeper sockets; empty: no keeper
  int idle_seconds = 600;
  bool may_start = true;  // false inside a corral job
};

// From the environment: CORRAL_KEEP_CONNECTION (seconds; 0 or "off" for none; anything
// else unparsable counts as the default), XDG_RUNTIME_DIR, CORRAL_JOB_ID.
KeeperUse keeper_use(const EnvLookup& env);

// The keeper's socket for `settings` (an https:// URL), making the folder when missing;
// empty when there is no keeper to use: turned off, a unix: URL, a folder that is not
// private, a path too long for a socket.
std::string keeper_socket(const KeeperUse& use, const ConnectionSettings& settings);

// Starts a keeper for `settings` at `socket`, detached from this process (its own
// session, no terminal, standard streams on /dev/null), and does not wait for it. Best
// effort: a keeper that cannot start leaves the next command to go directly.
void start_keeper(const KeeperUse& use, const ConnectionSettings& settings, const std::string& socket);

// `corral keep-connection --socket PATH --url URL --ca PATH [--session-file PATH]
// [--idle SECONDS]`: the keeper itself (args without the program name). Returns its exit
// code: 0 when it ended as above or found another keeper at the socket, 1 when it could
// not start (its reason on `err`).
int run_keeper(const std::vector<std::string>& args, std::ostream& err);

}  // namespace corral::cli
