#pragma once
// Watching ranks from /proc without touching the program: which ranks checked in to
// their job's rendezvous (their sockets against /proc/PID/net/tcp and tcp6), and what a
// rank's processes are doing (state, wait channel, CPU time). Reads files only; called
// off the agent's loop (a scan of /proc takes milliseconds on a busy node). `proc` is the
// procfs root, which tests point at a recorded tree.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/protocol/messages.hpp"

namespace corral::agent {

// One line of /proc/net/tcp or tcp6. Addresses as inet_ntop writes them; an IPv4 address
// mapped into IPv6 (::ffff:10.0.0.1) is written as the IPv4 one.
struct TcpSocket {
  std::uint64_t inode = 0;
  std::string local_addr;
  int local_port = 0;
  std::string remote_addr;
  int remote_port = 0;
  int state = 0;  // the kernel's TCP state: 1 established, 10 listen
};
inline constexpr int kTcpEstablished = 1;
inline constexpr int kTcpListen = 10;

// Lines that do not parse are skipped (the header among them).
std::vector<TcpSocket> parse_proc_net_tcp(std::string_view text, bool v6);

// One process, from /proc/PID/stat.
struct ProcStat {
  pid_t pid = 0;
  pid_t pgrp = 0;
  char state = '?';
  std::string comm;
  std::uint64_t cpu_ticks = 0;  // utime + stime
};
std::optional<ProcStat> parse_proc_stat(pid_t pid, std::string_view text);

// Every process of each of these process groups, by group, from one scan of /proc.
std::map<pid_t, std::vector<ProcStat>> processes_by_group(const std::vector<pid_t>& groups,
                                                           const std::string& proc = "/proc");

struct WatchedRank {
  int rank = 0;
  pid_t group = 0;  // the rank's process group (its leader's pid)
};

// The ranks among `ranks` that have checked in: rank 0 has a socket listening on
// `master_port`; any other rank a connection established to `master_addr`:`master_port`.
// The sockets of every process in the rank's group count (a shell wrapper's child).
std::vector<int> joined_ranks(const std::vector<WatchedRank>& ranks, const std::string& master_addr, int master_port,
                              const std::string& proc = "/proc");

// What each rank is doing: whether any process of its group lives, and the busiest
// one's state ("S (sleeping)"), wait channel and command; the group's CPU time.
std::vector<protocol::RankProcess> inspect_ranks(const std::vector<WatchedRank>& ranks,
                                                 const std::string& proc = "/proc");

}  // namespace corral::agent
