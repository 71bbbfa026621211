// The agent's parts that stand alone: holding a master port, the nccl-root child, the
// kill escalation and the log slices. Real sockets, real processes, a real event loop.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "agent/kill_escalation.hpp"
#include "agent/launcher.hpp"
#include "agent/log_reader.hpp"
#include "agent/master_port.hpp"
#include "agent/nccl_root.hpp"
#include "common/core/hex.hpp"
#include "common/net/event_loop.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

TEST(MasterPort, AHeldPortIsBusyForEveryoneElseUntilClosed) {
  auto first = hold_master_port("127.0.0.1", 0);
  ASSERT_TRUE(first) << first.error().message();
  int port = bound_port(*first);
  auto second = hold_master_port("127.0.0.1", port);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), ErrorCode::Conflict);
  EXPECT_NE(second.error().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << second.error().message();
  ::close(*first);
  auto again = hold_master_port("127.0.0.1", port);
  ASSERT_TRUE(again) << again.error().message();
  ::close(*again);
}

TEST(MasterPort, TheLastJobsConnectionsInTimeWaitDoNotMakeThePortBusy) {
  auto held = hold_master_port("127.0.0.1", 0);
  ASSERT_TRUE(held);
  int port = bound_port(*held);
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  int accepted = ::accept(*held, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  // The listening side closes first, as rank 0's store does: TIME_WAIT on the port.
  ::close(accepted);
  ::close(*held);
  ::close(client);
  auto again = hold_master_port("127.0.0.1", port);
  ASSERT_TRUE(again) << again.error().message();
  ::close(*again);
}

TEST(MasterPort, IPv6AndANameThatIsNoAddress) {
  auto v6 = hold_master_port("::1", 0);
  if (v6) {
    EXPECT_GT(bound_port(*v6), 0);
    ::close(*v6);
  } else {
    EXPECT_NE(v6.error().code(), ErrorCode::InvalidArgument) << v6.error().message();  // no IPv6 here
  }
  auto name = hold_master_port("gpu-a", 29500);
  ASSERT_FALSE(name);
  EXPECT_EQ(name.error().code(), ErrorCode::InvalidArgument);
  EXPECT_NE(name.error().message().find("gpu-a is not an IP address"), std::string::npos);
}

// A stand-in for `corral-worker nccl-root`: the script's body after the argument check.
std::string fake_worker(const testing::TempDir& dir, const std::string& body) {
  std::string path = dir.file("corral-worker");
  std::ofstream(path) << "#!/bin/sh\n[ \"$1\" = nccl-root ] || exit 64\n" << body << "\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(NcclRoot, TheChildsIdIsReadAndItLivesUntilItsStdinCloses) {
  testing::TempDir dir;
  std::string id(2 * kNcclUniqueIdBytes, 'a');
  auto worker = fake_worker(dir, "echo " + id + "\nexec cat >/dev/null");
  auto child = start_nccl_root(worker, "", dir.file("nccl-root.log"));
  ASSERT_TRUE(child) << child.error().message();
  auto got = read_nccl_root_id(child->id_fd, child->log_path, 10s);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(*got, id);
  EXPECT_TRUE(group_alive(child->pid)) << "the root must outlive the ID: the ranks connect to it";
  ::close(child->stdin_fd);
  int status = wait_exit(child->pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_status(status);
}

TEST(NcclRoot, AChildWithoutAnIdIsReportedWithItsLogsFirstLine) {
  testing::TempDir dir;
  auto worker = fake_worker(dir, "echo 'no CUDA device: cudaErrorNoDevice' >&2\necho not-an-id\nexit 1");
  auto child = start_nccl_root(worker, "eth9", dir.file("nccl-root.log"));
  ASSERT_TRUE(child) << child.error().message();
  auto got = read_nccl_root_id(child->id_fd, child->log_path, 10s);
  ::close(child->stdin_fd);
  wait_exit(child->pid);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ErrorCode::Unavailable);
  EXPECT_EQ(got.error().message(), "nccl-root gave no unique ID: no CUDA device: cudaErrorNoDevice");
}

TEST(NcclRoot, AChildThatHangsIsGivenUpOnAtTheTimeout) {
  testing::TempDir dir;
  auto worker = fake_worker(dir, "exec sleep 30");
  auto child = start_nccl_root(worker, "", dir.file("nccl-root.log"));
  ASSERT_TRUE(child) << child.error().message();
  auto begun = Clock::now();
  auto got = read_nccl_root_id(child->id_fd, child->log_path, 300ms);
  auto waited = Clock::now() - begun;
  EXPECT_FALSE(got);
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 5s);
  signal_group(child->pid, SIGKILL);
  ::close(child->stdin_fd);
  EXPECT_TRUE(WIFSIGNALED(wait_exit(child->pid)));
}

TEST(NcclRoot, AWorkerThatCannotStartIsAnErrorNotAChild) {
  testing::TempDir dir;
  auto child = start_nccl_root(dir.file("no-such-worker"), "", dir.file("nccl-root.log"));
  ASSERT_FALSE(child);
  EXPECT_NE(child.error().message().find("cannot start nccl-root"), std::string::npos) << child.error().message();
}

// Two ranks in their own process groups: one ends on SIGTERM, one ignores it (from the
// moment it says so: the signal must not arrive before its trap is set).
struct Ranks {
  pid_t polite = 0;
  pid_t stubborn = 0;
  Ranks() {
    ProcessSpec spec;
    spec.envp = {"PATH=/usr/bin:/bin"};
    spec.log_path = "/dev/null";
    spec.argv = {"sleep", "30"};
    polite = spawn(spec).value();
    int ready[2];
    if (::pipe(ready) != 0) std::abort();
    spec.stdout_fd = ready[1];
    spec.argv = {"/bin/sh", "-c", "trap '' TERM; echo trapped; exec >/dev/null; while :; do sleep 0.05; done"};
    stubborn = spawn(spec).value();
    ::close(ready[1]);
    char buf[16];
    if (::read(ready[0], buf, sizeof(buf)) <= 0) std::abort();
    ::close(ready[0]);
  }
  ~Ranks() {
    for (pid_t pid : {polite, stubborn}) {
      if (pid != 0 && signal_group(pid, SIGKILL)) ::waitpid(pid, nullptr, 0);
    }
  }
};

TEST(KillEscalation, SigtermFirstThenSigkillForTheRankThatIgnoresItAfterTheGrace) {
  Ranks ranks;
  net::EventLoop loop;
  KillEscalation kill(loop, "job 7 attempt 1");
  std::map<pid_t, std::pair<int, Clock::duration>> ended;  // pid -> (status, when)
  auto begun = Clock::now();
  loop.on_signal(SIGCHLD, [&] {
    for (auto [rank, pid] : {std::pair{0, ranks.polite}, std::pair{1, ranks.stubborn}}) {
      int status = 0;
      if (!ended.contains(pid) && ::waitpid(pid, &status, WNOHANG) == pid) {
        ended[pid] = {status, Clock::now() - begun};
        kill.exited(rank);
      }
    }
    if (ended.size() == 2) loop.stop();
  });
  net::Timer give_up(loop);
  give_up.start(20s, [&] { loop.stop(); });
  ASSERT_TRUE(kill.start({{0, ranks.polite}, {1, ranks.stubborn}}, 400ms));
  EXPECT_EQ(kill.waiting(), 2u);
  loop.run();
  ASSERT_EQ(ended.size(), 2u) << "both ranks should have ended";
  auto [polite_status, polite_at] = ended[ranks.polite];
  auto [stubborn_status, stubborn_at] = ended[ranks.stubborn];
  EXPECT_TRUE(WIFSIGNALED(polite_status) && WTERMSIG(polite_status) == SIGTERM) << describe_status(polite_status);
  EXPECT_LT(polite_at, 400ms);
  EXPECT_TRUE(WIFSIGNALED(stubborn_status) && WTERMSIG(stubborn_status) == SIGKILL) << describe_status(stubborn_status);
  EXPECT_GE(stubborn_at, 400ms);
  EXPECT_EQ(kill.waiting(), 0u);
  ranks.polite = ranks.stubborn = 0;
}

TEST(KillEscalation, ARankThatExitedIsNotKilledAtTheDeadlineAndNoGraceMeansSigkillNow) {
  Ranks ranks;
  net::EventLoop loop;
  KillEscalation kill(loop, "job 8 attempt 1");
  ASSERT_TRUE(kill.start({{1, ranks.stubborn}}, 100ms));
  kill.exited(1);  // as if reaped: its pid may be anyone's by the deadline
  EXPECT_EQ(kill.waiting(), 0u);
  net::Timer past_deadline(loop);
  past_deadline.start(400ms, [&] { loop.stop(); });
  loop.run();
  EXPECT_TRUE(group_alive(ranks.stubborn)) << "no SIGKILL may go to a rank already reaped";

  ASSERT_TRUE(kill.start({{0, ranks.polite}, {1, ranks.stubborn}}, 0ms));
  EXPECT_EQ(kill.waiting(), 0u);
  EXPECT_EQ(WTERMSIG(wait_exit(ranks.polite)), SIGKILL);
  EXPECT_EQ(WTERMSIG(wait_exit(ranks.stubborn)), SIGKILL);
  EXPECT_FALSE(kill.start({{0, ranks.polite}}, 1s)) << "nothing left to signal";
  ranks.polite = ranks.stubborn = 0;
}

TEST(LogReader, ServesBoundedSlicesWithTheFilesSize) {
  testing::TempDir dir;
  std::string path = dir.file("rank-0.log");
  std::ofstream(path) << "hello world";
  auto slice = read_log_slice(path, 6, 100);
  ASSERT_TRUE(slice);
  EXPECT_EQ(slice->data, "world");
  EXPECT_EQ(slice->size, 11u);
  EXPECT_EQ(read_log_slice(path, 0, 5)->data, "hello");
  EXPECT_EQ(read_log_slice(path, 11, 100)->data, "");
  EXPECT_EQ(read_log_slice(path, 1ULL << 40, 100)->data, "");
  std::ofstream(path, std::ios::app) << std::string(3 << 20, 'x');
  auto big = read_log_slice(path, 0, ~0ULL);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->data.size(), kMaxLogSlice);
  EXPECT_EQ(big->size, 11u + (3u << 20));
  auto missing = read_log_slice(dir.file("rank-9.log"), 0, 100);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::NotFound);
}

}  // namespace
}  // namespace corral::agent
