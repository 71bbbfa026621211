#pragma once
// Watching ranks from /proc without touching the program: which ranks checked in to
// their job's rendezvous (their sockets against /proc/PID/net/tcp and tcp6), and what a
// rank's processes are doing (state, wait channel, CPU time). Reads files only; called
// off the agent's loop (a scan of /proc takes milliseconds on a busy node). `proc` is the
// procfs root, which tests point at a recorded tree.

#include <sys/types.h>

#include <chrono>
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
// "S (sleeping)", from a state letter of /proc/PID/stat.
std::string describe_state(char state);
// The kernel function a process or thread (its /proc directory) waits in; empty if none.
std::string read_wchan(const std::string& dir);
// A file of /proc, whole; empty when unreadable.
std::string read_small_file(const std::string& path);

// Every process of each of these process groups, by group, from one scan of /proc.
std::map<pid_t, std::vector<ProcStat>> processes_by_group(const std::vector<pid_t>& groups,
                                                           const std::string& proc = "/proc");

// The processes of each group that descend from its leader (whose pid is the group's
// id), found by walking /proc/PID/task/*/children down from it: a few files per process
// of the rank instead of every process of the node. Falls back to processes_by_group
// where the kernel has no children files. A rank whose leader has exited has ended.
std::map<pid_t, std::vector<ProcStat>> group_members(const std::vector<pid_t>& groups,
                                                      const std::string& proc = "/proc");

struct WatchedRank {
  int rank = 0;
  pid_t group = 0;  // the rank's process group (its leader's pid)
};

// The ranks among `ranks` that have checked in: rank 0 has a socket listening on
// `master_port`; any other rank a connection established to `master_addr`:`master_port`.
// The sockets of every process in the rank's group count (a shell wrapper's child).
// Each socket is looked at through a duplicate (pidfd_getfd: root, Linux 5.6+); where
// that is refused, the sockets' inodes are found in the namespace's /proc/net/tcp{,6}.
// `look_directly` false: the tables only (what happens where pidfd_getfd is refused).
std::vector<int> joined_ranks(const std::vector<WatchedRank>& ranks, const std::string& master_addr, int master_port,
                              const std::string& proc = "/proc", bool look_directly = true);

// What each rank is doing: whether any process of its group lives, and the busiest
// one's state ("S (sleeping)"), wait channel and command; the group's CPU time.
std::vector<protocol::RankProcess> inspect_ranks(const std::vector<WatchedRank>& ranks,
                                                 const std::string& proc = "/proc");

// Whether a rank makes progress, from samples of its CPU time: it does while its
// processes used, on average since the last time they did, at least 1 % of one core (a
// thread that wakes now and then to poll is no progress; a rank computing, or spinning
// in a collective, is), or while one of its GPUs is busy (real GPUs: a rank waiting on
// its kernels uses no CPU). Stalled once it has not for `timeout`.
class CpuProgress {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Change { None, Stalled, Moving };

  // `gpu_busy`: a GPU of the rank's was busy (utilization above 0 %) at this sample, which
  // is progress whatever the CPU did.
  Change sample(Clock::time_point now, std::int64_t cpu_ms, std::chrono::milliseconds timeout,
                bool gpu_busy = false);
  bool stalled() const { return stalled_; }
  // Whether the CPU alone made no progress at the last sample: only then does it matter
  // whether a GPU is busy (the watch asks nvidia-smi only for such ranks).
  bool cpu_idle() const { return cpu_idle_; }
  // How long since it last made progress.
  std::chrono::milliseconds idle(Clock::time_point now) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - mark_at_);
  }

 private:
  bool started_ = false;
  bool stalled_ = false;
  bool cpu_idle_ = false;
  Clock::time_point mark_at_{};
  std::int64_t mark_cpu_ = 0;
};

}  // namespace corral::agent
