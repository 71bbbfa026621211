// Watching ranks from /proc: recorded /proc/net/tcp lines, and real processes in their
// own process groups that listen, connect, sleep, stop and spin.

#include "agent/rank_watch.hpp"

#include "agent/rank_stack.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace corral::agent {
namespace {

// Recorded from a node during a two-node DDP run: rank 0's store listening on all
// addresses at 29500, a rank connected to 10.0.0.11:29500, an ssh session, the header.
constexpr const char* kTcp =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 48213 1 0000000000000000 100 0 0 10 0\n"
    "   1: 0B00000A:A1B2 0B00000A:733C 01 00000000:00000000 00:00000000 00000000  1000        0 48377 1 0000000000000000 20 4 30 10 -1\n"
    "   2: 0B00000A:0016 0100000A:D6D8 01 00000000:00000000 02:000A8D2B 00000000     0        0 19011 2 0000000000000000 20 4 31 10 -1\n"
    "   3: garbage\n";

// IPv6: a listener on [::]:29500, a connection from a v4-mapped address, one over ::1.
constexpr const char* kTcp6 =
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:733C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51001 1 0000000000000000 100 0 0 10 0\n"
    "   1: 0000000000000000FFFF00000C00000A:B00A 0000000000000000FFFF00000B00000A:733C 01 00000000:00000000 00:00000000 00000000     0        0 51002 1 0000000000000000 20 4 30 10 -1\n"
    "   2: 00000000000000000000000001000000:C350 00000000000000000000000001000000:733C 01 00000000:00000000 00:00000000 00000000     0        0 51003 1 0000000000000000 20 4 30 10 -1\n";

TEST(ParseProcNetTcp, Ipv4LinesWithTheirStatesAndInodesTheRestSkipped) {
  auto sockets = parse_proc_net_tcp(kTcp, false);
  ASSERT_EQ(sockets.size(), 3u);
  EXPECT_EQ(sockets[0].local_addr, "0.0.0.0");
  EXPECT_EQ(sockets[0].local_port, 29500);
  EXPECT_EQ(sockets[0].state, kTcpListen);
  EXPECT_EQ(sockets[0].inode, 48213u);
  EXPECT_EQ(sockets[1].local_addr, "10.0.0.11");
  EXPECT_EQ(sockets[1].remote_addr, "10.0.0.11");
  EXPECT_EQ(sockets[1].remote_port, 29500);
  EXPECT_EQ(sockets[1].state, kTcpEstablished);
  EXPECT_EQ(sockets[2].remote_addr, "10.0.0.1");
  EXPECT_EQ(sockets[2].local_port, 22);
}

TEST(ParseProcNetTcp, Ipv6LinesAndV4MappedAddressesWrittenAsIpv4) {
  auto sockets = parse_proc_net_tcp(kTcp6, true);
  ASSERT_EQ(sockets.size(), 3u);
  EXPECT_EQ(sockets[0].local_addr, "::");
  EXPECT_EQ(sockets[0].state, kTcpListen);
  EXPECT_EQ(sockets[1].local_addr, "10.0.0.12");
  EXPECT_EQ(sockets[1].remote_addr, "10.0.0.11");
  EXPECT_EQ(sockets[1].remote_port, 29500);
  EXPECT_EQ(sockets[2].remote_addr, "::1");
  EXPECT_EQ(sockets[2].local_port, 50000);
  EXPECT_TRUE(parse_proc_net_tcp(kTcp, true).empty()) << "v4 lines are no v6 lines";
}

TEST(ParseProcStat, ACommandWithSpacesAndParenthesesEndsAtTheLastOne) {
  auto s = parse_proc_stat(812, "812 (py (x) 3) S 1 812 812 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 0 0");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->comm, "py (x) 3");
  EXPECT_EQ(s->state, 'S');
  EXPECT_EQ(s->pgrp, 812);
  EXPECT_EQ(s->cpu_ticks, 12u);
  EXPECT_EQ(parse_proc_stat(9, "9 (a\x1b]0;x\x07) S 1 9 9 0 -1 0 0 0 0 0 1 1 0 0")->comm, "a?]0;x?")
      << "control characters in a command name are not passed on";
  EXPECT_FALSE(parse_proc_stat(1, "1 (init) S 0"));
  EXPECT_FALSE(parse_proc_stat(1, ""));
}

// A child in its own process group running `body`; it writes a byte when ready.
class Child {
 public:
  explicit Child(const std::function<void()>& body) {
    int ready[2];
    if (::pipe(ready) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::close(ready[0]);
      ready_fd = ready[1];
      body();
      std::_Exit(0);
    }
    ::setpgid(pid_, pid_);
    ::close(ready[1]);
    char c;
    if (::read(ready[0], &c, 1) != 1) std::abort();
    ::close(ready[0]);
  }
  ~Child() {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

  static inline int ready_fd = -1;
  static void ready() {
    char c = 'r';
    if (::write(ready_fd, &c, 1) != 1) std::_Exit(1);
  }
  static void park() {
    for (;;) ::pause();
  }

 private:
  pid_t pid_ = 0;
};

int listener(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 16) != 0) std::abort();
  return fd;
}

int port_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

void connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) std::_Exit(2);
}

TEST(JoinedRanks, RankZeroListensTheOthersConnectAWrappersChildCounts) {
  // The master port, found free by binding port 0; rank 0 listens on it.
  int probe = listener(0);
  int master = port_of(probe);
  ::close(probe);
  Child rank0([&] {
    listener(master);
    Child::ready();
    Child::park();
  });
  Child rank1([&] {
    connect_to(master);
    Child::ready();
    Child::park();
  });
  // Rank 2 is a wrapper whose child (same group) connects: the group's sockets count.
  Child rank2([&] {
    if (::fork() == 0) {
      connect_to(master);
      Child::ready();
      Child::park();
    }
    Child::park();
  });
  // Rank 3 connects elsewhere (its own listener); rank 4 has no socket at all.
  Child rank3([&] {
    int other = listener(0);
    connect_to(port_of(other));
    Child::ready();
    Child::park();
  });
  Child rank4([&] {
    Child::ready();
    Child::park();
  });
  std::vector<WatchedRank> ranks{{0, rank0.pid()}, {1, rank1.pid()}, {2, rank2.pid()}, {3, rank3.pid()},
                                 {4, rank4.pid()}};
  // Both ways: each socket looked at directly (pidfd_getfd), and from the TCP tables.
  for (bool directly : {true, false}) {
    SCOPED_TRACE(directly ? "pidfd_getfd" : "/proc/net/tcp");
    EXPECT_EQ(joined_ranks(ranks, "127.0.0.1", master, "/proc", directly), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(joined_ranks(ranks, "::ffff:127.0.0.1", master, "/proc", directly), (std::vector<int>{0, 1, 2}))
        << "the same address written v4-mapped";
    EXPECT_EQ(joined_ranks(ranks, "10.0.0.11", master, "/proc", directly), (std::vector<int>{0}))
        << "connected, but to another address";
    EXPECT_EQ(joined_ranks(ranks, "127.0.0.1", master + 1 == 65536 ? 1 : master + 1, "/proc", directly),
              (std::vector<int>{}));
    EXPECT_EQ(joined_ranks({{1, 999999}}, "127.0.0.1", master, "/proc", directly), (std::vector<int>{}))
        << "no such group";
  }
}

std::int64_t cpu_ms_now() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

TEST(InspectRanks, SleepingStoppedSpinningAndGone) {
  Child sleeper([] {
    Child::ready();
    Child::park();
  });
  Child stopped([] {
    Child::ready();
    Child::park();
  });
  ASSERT_EQ(::kill(stopped.pid(), SIGSTOP), 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(stopped.pid()), &info, WSTOPPED | WNOWAIT), 0);  // stopped now
  // Spins 300 ms of CPU, then sleeps: its CPU time is what it used, not wall time.
  Child spinner([] {
    while (cpu_ms_now() < 300) {
    }
    Child::ready();
    Child::park();
  });
  pid_t gone = ::fork();
  if (gone == 0) std::_Exit(0);
  ::waitpid(gone, nullptr, 0);

  // The sleeper said it is ready just before pause(): until it is in there /proc may
  // still say R, so look again until it says S (the state is what is tested).
  std::vector<protocol::RankProcess> seen;
  for (int i = 0; i < 1000; ++i) {
    seen = inspect_ranks({{0, sleeper.pid()}, {1, stopped.pid()}, {2, spinner.pid()}, {3, gone}});
    if (seen.size() == 4 && seen[0].state.starts_with("S")) break;
    ::sched_yield();
  }
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].rank, 0);
  EXPECT_TRUE(seen[0].alive);
  EXPECT_EQ(seen[0].pid, sleeper.pid());
  EXPECT_EQ(seen[0].state, "S (sleeping)");
  EXPECT_EQ(seen[0].processes, 1);
  EXPECT_FALSE(seen[0].command.empty());
  EXPECT_TRUE(seen[1].alive);
  EXPECT_EQ(seen[1].state, "T (stopped)");
  EXPECT_GE(seen[2].cpu_ms, 250);
  EXPECT_LT(seen[2].cpu_ms, 5000);
  EXPECT_EQ(seen[3].rank, 3);
  EXPECT_FALSE(seen[3].alive);
  EXPECT_EQ(seen[3].pid, 0);
  ::kill(stopped.pid(), SIGCONT);
}

TEST(InspectRanks, AZombieIsNotAlive) {
  pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    std::_Exit(0);
  }
  ::setpgid(child, child);
  // Unreaped: /proc shows it as Z until waited for.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  auto seen = inspect_ranks({{5, child}});
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].alive);
  EXPECT_EQ(seen[0].state, "Z (zombie)");
  ::waitpid(child, nullptr, 0);
}

using Steady = CpuProgress::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(CpuProgress, StalledAfterTheTimeoutWithoutCpuAndMovingAgainWhenItComputes) {
  CpuProgress p;
  const Steady::time_point t0{};
  const milliseconds timeout = seconds(5);
  EXPECT_EQ(p.sample(t0, 1000, timeout), CpuProgress::Change::None);  // the first look only marks
  EXPECT_EQ(p.sample(t0 + seconds(1), 1900, timeout), CpuProgress::Change::None);  // busy
  EXPECT_EQ(p.sample(t0 + seconds(5), 1900, timeout), CpuProgress::Change::None);
  EXPECT_EQ(p.idle(t0 + seconds(5)), seconds(4));
  EXPECT_EQ(p.sample(t0 + seconds(6), 1900, timeout), CpuProgress::Change::Stalled);
  EXPECT_TRUE(p.stalled());
  EXPECT_EQ(p.sample(t0 + seconds(7), 1900, timeout), CpuProgress::Change::None) << "reported once";
  EXPECT_EQ(p.sample(t0 + seconds(8), 2500, timeout), CpuProgress::Change::Moving);
  EXPECT_FALSE(p.stalled());
  EXPECT_EQ(p.idle(t0 + seconds(8)), seconds(0));
}

TEST(CpuProgress, AThreadThatWakesNowAndThenIsNoProgress) {
  CpuProgress p;
  const Steady::time_point t0{};
  p.sample(t0, 0, seconds(10));
  // 10 ms of CPU every 3 s: 0.3 % of a core, under the 1 % that counts.
  CpuProgress::Change last = CpuProgress::Change::None;
  for (int i = 1; i <= 4; ++i) last = p.sample(t0 + seconds(3 * i), 10 * i, seconds(10));
  EXPECT_EQ(last, CpuProgress::Change::Stalled);
  // A process of the group ended, taking its CPU time along: not progress either.
  EXPECT_EQ(p.sample(t0 + seconds(13), 5, seconds(10)), CpuProgress::Change::None);
  EXPECT_TRUE(p.stalled());
  EXPECT_EQ(p.sample(t0 + seconds(14), 5 + 200, seconds(10)), CpuProgress::Change::Moving);
}

TEST(CpuProgress, ABusyGpuIsProgressWhileTheCpuIdles) {
  // A rank waiting on its kernels uses no CPU; its GPU does the work.
  CpuProgress p;
  const Steady::time_point t0{};
  const milliseconds timeout = seconds(5);
  p.sample(t0, 100, timeout);
  EXPECT_FALSE(p.cpu_idle()) << "nothing known yet";
  for (int s = 1; s <= 10; ++s) {
    EXPECT_EQ(p.sample(t0 + seconds(s), 100, timeout, true), CpuProgress::Change::None) << s;
    EXPECT_TRUE(p.cpu_idle());
  }
  EXPECT_FALSE(p.stalled());
  // The GPU goes idle too: the timeout counts from its last busy sample.
  EXPECT_EQ(p.sample(t0 + seconds(14), 100, timeout, false), CpuProgress::Change::None);
  EXPECT_EQ(p.sample(t0 + seconds(15), 100, timeout, false), CpuProgress::Change::Stalled);
  EXPECT_EQ(p.sample(t0 + seconds(16), 100, timeout, true), CpuProgress::Change::Moving);
  EXPECT_EQ(p.sample(t0 + seconds(17), 600, timeout), CpuProgress::Change::None);
  EXPECT_FALSE(p.cpu_idle()) << "computing on the CPU";
}

TEST(CpuProgress, ZeroTimeoutNeverStalls) {
  CpuProgress p;
  const Steady::time_point t0{};
  p.sample(t0, 0, milliseconds(0));
  EXPECT_EQ(p.sample(t0 + std::chrono::hours(1), 0, milliseconds(0)), CpuProgress::Change::None);
}

TEST(RankStack, ProcThreadsAndTheToolsOutputForEachProcessOfTheGroup) {
  Child rank([] {
    Child::ready();
    Child::park();
  });
  // A stand-in for gdb that shows what it was asked: the code around the tool is tested
  // here; the real gdb runs in the end-to-end test.
  char dir_template[] = "/tmp/corral-stack-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  std::string fake = std::string(dir_template) + "/gdb";
  {
    FILE* f = std::fopen(fake.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("#!/bin/sh\necho \"fake gdb: $*\"\n", f);
    std::fclose(f);
    ::chmod(fake.c_str(), 0755);
  }
  StackTools tools = find_stack_tools(dir_template);
  EXPECT_EQ(tools.gdb, fake);
  EXPECT_TRUE(tools.py_spy.empty());
  std::string report = rank_stack_report(rank.pid(), tools);
  std::string pid = std::to_string(rank.pid());
  EXPECT_NE(report.find("process " + pid + " ("), std::string::npos) << report;
  EXPECT_NE(report.find("  thread " + pid + " ("), std::string::npos) << report;
  EXPECT_NE(report.find("fake gdb: -p " + pid + " -batch -nx -ex set pagination off -ex thread apply all bt"),
            std::string::npos)
      << report;
  std::remove(fake.c_str());
  ::rmdir(dir_template);

  tools.gdb.clear();
  report = rank_stack_report(rank.pid(), tools);
  EXPECT_NE(report.find("native stacks: gdb is not installed on this node"), std::string::npos) << report;
  EXPECT_EQ(rank_stack_report(0, tools), "no process of the rank is running on this node\n");
}

}  // namespace
}  // namespace corral::agent
