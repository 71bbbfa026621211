#include "agent/rank_watch.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace corral::agent {

namespace {

template <class T>
bool hex_to(std::string_view text, T& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out, 16);
  return ec == std::errc() && ptr == text.data() + text.size();
}

// "0100007F:1F90" (v4) or 32 hex digits ":" port (v6): the kernel prints each 32-bit word
// of the address as the integer it holds in memory, so storing it back gives the bytes.
bool parse_endpoint(std::string_view text, bool v6, std::string& addr, int& port) {
  auto colon = text.find(':');
  if (colon == std::string_view::npos) return false;
  std::string_view hex = text.substr(0, colon);
  if (!hex_to(text.substr(colon + 1), port)) return false;
  char out[INET6_ADDRSTRLEN] = {};
  if (!v6) {
    std::uint32_t word = 0;
    if (hex.size() != 8 || !hex_to(hex, word)) return false;
    in_addr a{};
    a.s_addr = word;
    ::inet_ntop(AF_INET, &a, out, sizeof(out));
  } else {
    if (hex.size() != 32) return false;
    in6_addr a{};
    for (int i = 0; i < 4; ++i) {
      std::uint32_t word = 0;
      if (!hex_to(hex.substr(static_cast<std::size_t>(i) * 8, 8), word)) return false;
      std::memcpy(&a.s6_addr[i * 4], &word, 4);
    }
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      in_addr v4{};
      std::memcpy(&v4.s_addr, &a.s6_addr[12], 4);
      ::inet_ntop(AF_INET, &v4, out, sizeof(out));
    } else {
      ::inet_ntop(AF_INET6, &a, out, sizeof(out));
    }
  }
  addr = out;
  return true;
}

// The address as inet_ntop writes it, so that "::1" and "0:0::1" compare equal.
std::string canonical_address(const std::string& text) {
  char out[INET6_ADDRSTRLEN] = {};
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return ::inet_ntop(AF_INET, &v4, out, sizeof(out));
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      std::memcpy(&v4.s_addr, &v6.s6_addr[12], 4);
      return ::inet_ntop(AF_INET, &v4, out, sizeof(out));
    }
    return ::inet_ntop(AF_INET6, &v6, out, sizeof(out));
  }
  return text;
}

// Control characters (a process may name itself anything) become '?': these names
// reach logs and terminals.
std::string printable(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    std::size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

bool numeric(const char* name) {
  if (*name == '\0') return false;
  for (const char* c = name; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  return true;
}

std::vector<pid_t> all_pids(const std::string& proc) {
  std::vector<pid_t> out;
  DIR* dir = ::opendir(proc.c_str());
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    if (numeric(e->d_name)) out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
  }
  ::closedir(dir);
  return out;
}

// The inodes of a process's sockets: its fd links that read "socket:[N]".
void socket_inodes(pid_t pid, const std::string& proc, std::set<std::uint64_t>& out) {
  std::string dir_path = proc + "/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(dir_path.c_str());
  if (dir == nullptr) return;
  char target[64];
  while (dirent* e = ::readdir(dir)) {
    if (!numeric(e->d_name)) continue;
    ssize_t n = ::readlinkat(::dirfd(dir), e->d_name, target, sizeof(target) - 1);
    if (n <= 0) continue;
    std::string_view link(target, static_cast<std::size_t>(n));
    if (!link.starts_with("socket:[") || !link.ends_with("]")) continue;
    std::uint64_t inode = 0;
    auto digits = link.substr(8, link.size() - 9);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), inode);
    if (ec == std::errc() && ptr == digits.data() + digits.size()) out.insert(inode);
  }
  ::closedir(dir);
}

// The pids listed in /proc/PID/task/*/children (each thread's children); nullopt when
// the kernel has no such files.
std::optional<std::vector<pid_t>> children_of(pid_t pid, const std::string& proc) {
  std::string task_dir = proc + "/" + std::to_string(pid) + "/task";
  DIR* dir = ::opendir(task_dir.c_str());
  if (dir == nullptr) return std::vector<pid_t>{};  // gone
  std::vector<pid_t> out;
  bool any = false;
  while (dirent* e = ::readdir(dir)) {
    if (!numeric(e->d_name)) continue;
    std::string file = task_dir + "/" + e->d_name + "/children";
    if (::access(file.c_str(), R_OK) != 0) continue;
    any = true;
    std::string text = read_small_file(file);
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t end = text.find(' ', at);
      if (end == std::string::npos) end = text.size();
      pid_t child = 0;
      auto [ptr, ec] = std::from_chars(text.data() + at, text.data() + end, child);
      if (ec == std::errc() && child > 0) out.push_back(child);
      at = end + 1;
    }
  }
  ::closedir(dir);
  if (!any) return std::nullopt;
  return out;
}

// The check-in rule, for one socket: rank 0 listens on the master port; any other rank
// is connected to the master address and port (`remote` empty: not connected).
bool checks_in(int rank, bool listening, int local_port, const std::string& remote, int remote_port,
               const std::string& master, int master_port) {
  if (rank == 0) return listening && local_port == master_port;
  return !remote.empty() && remote_port == master_port && remote == master;
}

// A socket of process `pid` (its descriptor `fd`), looked at directly: a duplicate taken
// with pidfd_getfd, asked for its state and addresses, closed. Costs a few system calls
// per socket, where reading /proc/net/tcp walks the kernel's whole connection table.
struct SocketLook {
  bool listening = false;
  int local_port = 0;
  std::string remote_addr;  // empty unless connected
  int remote_port = 0;
};
enum class LookResult { Ok, NotTcp, Unsupported };

LookResult look_at_socket(int pidfd, int fd, SocketLook& out) {
#if defined(SYS_pidfd_getfd)
  int dup = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  if (dup < 0) return errno == ENOSYS || errno == EPERM ? LookResult::Unsupported : LookResult::NotTcp;
  LookResult result = LookResult::NotTcp;
  int protocol = 0;
  socklen_t len = sizeof(protocol);
  if (::getsockopt(dup, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0 && protocol == IPPROTO_TCP) {
    result = LookResult::Ok;
    int accepting = 0;
    len = sizeof(accepting);
    out.listening = ::getsockopt(dup, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting != 0;
    auto port_and_address = [](const sockaddr_storage& ss, int& port, std::string* addr) {
      char text[INET6_ADDRSTRLEN] = {};
      if (ss.ss_family == AF_INET) {
        const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
        port = ntohs(a->sin_port);
        if (addr != nullptr) *addr = ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      } else if (ss.ss_family == AF_INET6) {
        const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
        port = ntohs(a->sin6_port);
        if (addr != nullptr) *addr = ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      }
    };
    sockaddr_storage ss{};
    len = sizeof(ss);
    if (::getsockname(dup, reinterpret_cast<sockaddr*>(&ss), &len) == 0) port_and_address(ss, out.local_port, nullptr);
    ss = {};
    len = sizeof(ss);
    if (!out.listening && ::getpeername(dup, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      port_and_address(ss, out.remote_port, &out.remote_addr);
    }
  }
  ::close(dup);
  return result;
#else
  (void)pidfd;
  (void)fd;
  (void)out;
  return LookResult::Unsupported;
#endif
}

// Whether a socket of `pid` has checked in (see joined_ranks); nullopt when the sockets
// cannot be looked at directly (no pidfd_getfd, or not allowed), so the tables must do.
std::optional<bool> checked_in_directly(pid_t pid, int rank, const std::string& master, int master_port,
                                        const std::string& proc) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  if (proc != "/proc") return std::nullopt;  // a recorded tree has no processes behind it
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno == ESRCH ? std::optional<bool>(false) : std::nullopt;
  std::string dir_path = proc + "/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(dir_path.c_str());
  std::optional<bool> in = false;
  if (dir != nullptr) {
    char target[64];
    while (dirent* e = ::readdir(dir)) {
      if (!numeric(e->d_name)) continue;
      ssize_t n = ::readlinkat(::dirfd(dir), e->d_name, target, sizeof(target) - 1);
      if (n <= 0 || std::string_view(target, static_cast<std::size_t>(n)).substr(0, 8) != "socket:[") continue;
      SocketLook look;
      auto r = look_at_socket(pidfd, std::atoi(e->d_name), look);
      if (r == LookResult::Unsupported) {
        in = std::nullopt;
        break;
      }
      if (r != LookResult::Ok) continue;
      if (checks_in(rank, look.listening, look.local_port, canonical_address(look.remote_addr), look.remote_port,
                    master, master_port)) {
        in = true;
        break;
      }
    }
    ::closedir(dir);
  }
  ::close(pidfd);
  return in;
#else
  (void)pid;
  (void)rank;
  (void)master;
  (void)master_port;
  (void)proc;
  return std::nullopt;
#endif
}

}  // namespace

std::string describe_state(char state) {
  static constexpr std::pair<char, const char*> kStates[] = {
      {'R', "running"}, {'S', "sleeping"}, {'D', "disk sleep"}, {'T', "stopped"}, {'t', "tracing stop"},
      {'Z', "zombie"},  {'X', "dead"},     {'I', "idle"}};
  std::string out(1, state);
  for (const auto& [c, name] : kStates) {
    if (c == state) out += std::string(" (") + name + ")";
  }
  return out;
}

std::string read_wchan(const std::string& dir) {
  std::string wchan = read_small_file(dir + "/wchan");
  return wchan == "0" ? std::string() : printable(std::string_view(wchan).substr(0, 128));
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<TcpSocket> parse_proc_net_tcp(std::string_view text, bool v6) {
  std::vector<TcpSocket> out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    auto w = words(text.substr(start, end - start));
    start = end + 1;
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    if (w.size() < 10 || !w[0].ends_with(":")) continue;
    TcpSocket s;
    if (!parse_endpoint(w[1], v6, s.local_addr, s.local_port)) continue;
    if (!parse_endpoint(w[2], v6, s.remote_addr, s.remote_port)) continue;
    if (!hex_to(w[3], s.state)) continue;
    auto [ptr, ec] = std::from_chars(w[9].data(), w[9].data() + w[9].size(), s.inode);
    if (ec != std::errc() || ptr != w[9].data() + w[9].size()) continue;
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<ProcStat> parse_proc_stat(pid_t pid, std::string_view text) {
  // "PID (comm) S ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ..."
  // The command may hold spaces and parentheses: it ends at the last ')'.
  auto open = text.find('(');
  auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  ProcStat s;
  s.pid = pid;
  s.comm = printable(text.substr(open + 1, close - open - 1));
  auto rest = words(text.substr(close + 1));
  // rest[0] state, [1] ppid, [2] pgrp, ... [11] utime, [12] stime
  if (rest.size() < 13 || rest[0].size() != 1) return std::nullopt;
  s.state = rest[0][0];
  auto number = [](std::string_view t, auto& out) {
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
    return ec == std::errc() && ptr == t.data() + t.size();
  };
  std::uint64_t utime = 0;
  std::uint64_t stime = 0;
  if (!number(rest[2], s.pgrp) || !number(rest[11], utime) || !number(rest[12], stime)) return std::nullopt;
  s.cpu_ticks = utime + stime;
  return s;
}

std::map<pid_t, std::vector<ProcStat>> group_members(const std::vector<pid_t>& groups, const std::string& proc) {
  std::map<pid_t, std::vector<ProcStat>> out;
  std::vector<pid_t> need_scan;
  for (pid_t g : groups) {
    if (g <= 0) continue;
    // From the leader down: its descendants that are still in its group.
    std::vector<pid_t> todo{g};
    std::set<pid_t> seen;
    std::vector<ProcStat> members;
    bool walked = true;
    while (!todo.empty() && seen.size() < 4096) {
      pid_t pid = todo.back();
      todo.pop_back();
      if (!seen.insert(pid).second) continue;
      auto stat = parse_proc_stat(pid, read_small_file(proc + "/" + std::to_string(pid) + "/stat"));
      if (!stat) continue;  // gone
      auto kids = children_of(pid, proc);
      if (!kids) {
        walked = false;
        break;
      }
      todo.insert(todo.end(), kids->begin(), kids->end());
      if (stat->pgrp == g) members.push_back(std::move(*stat));
    }
    if (!walked) {
      need_scan.push_back(g);
    } else if (!members.empty()) {
      out[g] = std::move(members);
    }
  }
  if (!need_scan.empty()) {
    for (auto& [g, members] : processes_by_group(need_scan, proc)) out[g] = std::move(members);
  }
  return out;
}

std::map<pid_t, std::vector<ProcStat>> processes_by_group(const std::vector<pid_t>& groups, const std::string& proc) {
  std::map<pid_t, std::vector<ProcStat>> out;
  std::set<pid_t> wanted;
  for (pid_t g : groups) {
    if (g > 0) wanted.insert(g);  // 0: no process (kernel threads have group 0)
  }
  if (wanted.empty()) return out;
  for (pid_t pid : all_pids(proc)) {
    auto stat = parse_proc_stat(pid, read_small_file(proc + "/" + std::to_string(pid) + "/stat"));
    if (stat && wanted.contains(stat->pgrp)) out[stat->pgrp].push_back(std::move(*stat));
  }
  return out;
}

std::vector<int> joined_ranks(const std::vector<WatchedRank>& ranks, const std::string& master_addr, int master_port,
                              const std::string& proc, bool look_directly) {
  std::vector<int> joined;
  if (ranks.empty()) return joined;
  std::vector<pid_t> groups;
  for (const auto& r : ranks) groups.push_back(r.group);
  auto members = group_members(groups, proc);
  const std::string master = canonical_address(master_addr);
  // The TCP tables of a network namespace, read once per namespace.
  std::map<std::string, std::vector<TcpSocket>> tables;
  for (const auto& r : ranks) {
    auto it = members.find(r.group);
    if (it == members.end()) continue;
    // Directly where the kernel allows it; else from the namespace's TCP tables.
    std::optional<bool> direct = false;
    if (!look_directly) direct.reset();
    for (const auto& p : it->second) {
      if (!look_directly) break;
      direct = checked_in_directly(p.pid, r.rank, master, master_port, proc);
      if (!direct || *direct) break;
    }
    if (direct) {
      if (*direct) joined.push_back(r.rank);
      continue;
    }
    std::set<std::uint64_t> inodes;
    for (const auto& p : it->second) socket_inodes(p.pid, proc, inodes);
    if (inodes.empty()) continue;
    std::string pid_dir = proc + "/" + std::to_string(it->second.front().pid);
    char ns[64] = {};
    ssize_t n = ::readlink((pid_dir + "/ns/net").c_str(), ns, sizeof(ns) - 1);
    std::string key = n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : pid_dir;
    auto table = tables.find(key);
    if (table == tables.end()) {
      std::vector<TcpSocket> sockets = parse_proc_net_tcp(read_small_file(pid_dir + "/net/tcp"), false);
      auto v6 = parse_proc_net_tcp(read_small_file(pid_dir + "/net/tcp6"), true);
      sockets.insert(sockets.end(), v6.begin(), v6.end());
      table = tables.emplace(key, std::move(sockets)).first;
    }
    bool in = std::any_of(table->second.begin(), table->second.end(), [&](const TcpSocket& s) {
      if (!inodes.contains(s.inode)) return false;
      return checks_in(r.rank, s.state == kTcpListen, s.local_port, s.state == kTcpEstablished ? s.remote_addr : "",
                       s.remote_port, master, master_port);
    });
    if (in) joined.push_back(r.rank);
  }
  return joined;
}

std::vector<protocol::RankProcess> inspect_ranks(const std::vector<WatchedRank>& ranks, const std::string& proc) {
  std::vector<pid_t> groups;
  for (const auto& r : ranks) groups.push_back(r.group);
  auto members = group_members(groups, proc);
  const long ticks = std::max(1L, ::sysconf(_SC_CLK_TCK));
  std::vector<protocol::RankProcess> out;
  for (const auto& r : ranks) {
    protocol::RankProcess p;
    p.rank = r.rank;
    auto it = members.find(r.group);
    if (it != members.end()) {
      const auto& procs = it->second;
      std::uint64_t total = 0;
      for (const auto& s : procs) total += s.cpu_ticks;
      // The busiest process is the program (not the shell that waits for it); on a tie
      // the newest, which a wrapper started.
      const ProcStat* main = &procs.front();
      for (const auto& s : procs) {
        if (s.cpu_ticks > main->cpu_ticks || (s.cpu_ticks == main->cpu_ticks && s.pid > main->pid)) main = &s;
      }
      p.alive = std::any_of(procs.begin(), procs.end(), [](const auto& s) { return s.state != 'Z'; });
      p.pid = main->pid;
      p.command = main->comm;
      p.state = describe_state(main->state);
      p.wchan = read_wchan(proc + "/" + std::to_string(main->pid));
      p.cpu_ms = static_cast<std::int64_t>(total * 1000 / static_cast<std::uint64_t>(ticks));
      p.processes = static_cast<int>(procs.size());
    }
    out.push_back(std::move(p));
  }
  return out;
}

CpuProgress::Change CpuProgress::sample(Clock::time_point now, std::int64_t cpu_ms,
                                        std::chrono::milliseconds timeout, bool gpu_busy) {
  if (!started_) {
    started_ = true;
    mark_at_ = now;
    mark_cpu_ = cpu_ms;
    return Change::None;
  }
  if (cpu_ms < mark_cpu_) mark_cpu_ = cpu_ms;  // a process of the group ended: its time left with it
  auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(now - mark_at_).count();
  std::int64_t used = cpu_ms - mark_cpu_;
  cpu_idle_ = !(used > 0 && used * 100 >= elapsed);
  if (gpu_busy || !cpu_idle_) {
    mark_at_ = now;
    mark_cpu_ = cpu_ms;
    if (stalled_) {
      stalled_ = false;
      return Change::Moving;
    }
    return Change::None;
  }
  if (!stalled_ && timeout.count() > 0 && now - mark_at_ >= timeout) {
    stalled_ = true;
    return Change::Stalled;
  }
  return Change::None;
}

}  // namespace corral::agent
