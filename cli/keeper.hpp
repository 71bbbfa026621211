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
//   answered it, starts one (not inside a corral job, whose processes end with it), with
//   none of the command's environment or descriptors and / as its folder. The keeper stops
//   taking commands after CORRAL_KEEP_CONNECTION seconds without one (600 by default; 0
//   turns keepers off), once it could not get an answer from the coordinator (it answers
//   that command with the reason; the next goes directly), once the coordinator's address
//   refuses connections (looked at every 2 s; a refusal seen twice with nothing relayed in
//   between, or a host name that no longer resolves), or when its socket or CA file is
//   removed or replaced. It then removes its socket and lets go of its lock (a new
//   keeper may start at once), serves the commands already connected, each until it has
//   been idle 15 s, and ends. It serves up to 512 commands at once; a request whose
//   command has gone meanwhile (interrupted, or given up) is not relayed.
// - What: each request's method, target, body and end-to-end headers (a repeated header
//   keeps its last value), each answer back; a failure of its own comes back as HTTP 502
//   with X-Corral-Keeper-Error naming the error code, and the message as {"error": ...}.
// - A keeper that ends without answering (killed): the command sends the request again
//   directly when the coordinator cannot have seen it (it was not sent whole, or it is a
//   GET), and otherwise fails saying it may have reached the coordinator; either way its
//   later requests go directly.

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
