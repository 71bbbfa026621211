// run_command with real processes: exit statuses, signals, timeouts that leave nothing
// behind, output bounds, and what the child inherits.

#include "agent/inventory/run_command.hpp"

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <atomic>
#include <thread>

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corral::agent {
namespace {

using std::chrono::steady_clock;
using ::testing::HasSubstr;

constexpr Duration kGenerous{10'000};

// A process is gone when it no longer exists or is only a zombie waiting for init.
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::path(::testing::TempDir()) / (name + "-" + std::to_string(::getpid()));
}

TEST(RunCommand, AThreadReapingEveryOtherChildLeavesTheCommandsChildAlone) {
  // The agent's loop reaps its children with waitid(P_ALL) while commands run on other
  // threads; it skips what run_command_owns says is a command's.
  std::atomic<bool> stop{false};
  std::atomic<int> stolen{0};
  std::thread reaper([&] {
    while (!stop) {
      siginfo_t info{};
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0 &&
          !run_command_owns(info.si_pid)) {
        int status = 0;
        if (::waitpid(info.si_pid, &status, WNOHANG) == info.si_pid) ++stolen;
      }
      std::this_thread::yield();
    }
  });
  int right = 0;
  for (int i = 0; i < 50; ++i) {
    auto r = run_command({"/bin/sh", "-c", "exit 3"}, kGenerous);
    right += r && r->exit_code == 3;
  }
  stop = true;
  reaper.join();
  EXPECT_EQ(right, 50);
  EXPECT_EQ(stolen.load(), 0);
}

TEST(RunCommand, CapturesTheStdoutOfEcho) {
  auto result = run_command({"/bin/echo", "hello", "world"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out, "hello world\n");
  EXPECT_EQ(result->err, "");
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_EQ(result->signal, 0);
  EXPECT_TRUE(result->succeeded());
}

TEST(RunCommand, CapturesStderrSeparately) {
  auto result = run_command({"/bin/sh", "-c", "echo out; echo err >&2"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out, "out\n");
  EXPECT_EQ(result->err, "err\n");
}

TEST(RunCommand, ReportsANonZeroExitStatus) {
  auto result = run_command({"/bin/sh", "-c", "exit 3"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_EQ(result->signal, 0);
  EXPECT_FALSE(result->succeeded());
}

TEST(RunCommand, ReportsTheSignalThatEndedTheProgram) {
  auto result = run_command({"/bin/sh", "-c", "kill -TERM $$"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->signal, SIGTERM);
  EXPECT_EQ(result->exit_code, 128 + SIGTERM);
  EXPECT_FALSE(result->succeeded());
}

TEST(RunCommand, LooksUpAProgramWithoutASlashInPath) {
  auto result = run_command({"echo", "found"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out, "found\n");
}

TEST(RunCommand, ReportsANonexistentProgramAsNotFound) {
  auto absolute = run_command({"/nonexistent/corral-no-such-program"}, kGenerous);
  ASSERT_FALSE(absolute.has_value());
  EXPECT_EQ(absolute.error().code(), ErrorCode::NotFound);
  EXPECT_THAT(absolute.error().message(), HasSubstr("corral-no-such-program"));
  auto in_path = run_command({"corral-no-such-program-either"}, kGenerous);
  ASSERT_FALSE(in_path.has_value());
  EXPECT_EQ(in_path.error().code(), ErrorCode::NotFound);
}

TEST(RunCommand, ReportsAFileThatIsNotExecutableAsPermissionDenied) {
  const auto path = temp_file("corral-not-executable");
  std::ofstream(path) << "#!/bin/sh\necho hi\n";
  std::filesystem::permissions(path,
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto result = run_command({path.string()}, kGenerous);
  std::filesystem::remove(path);
  ASSERT_FALSE(result.has_value());
  // Root may execute nothing without an x bit either, so this holds for every user.
  EXPECT_EQ(result.error().code(), ErrorCode::PermissionDenied);
}

TEST(RunCommand, TimesOutQuicklyOnASleepAndLeavesNoChild) {
  const auto start = steady_clock::now();
  auto result = run_command({"/bin/sleep", "30"}, Duration(200));
  const auto elapsed = steady_clock::now() - start;
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::Timeout);
  EXPECT_THAT(result.error().message(), HasSubstr("/bin/sleep 30"));
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  EXPECT_GE(elapsed, std::chrono::milliseconds(150));
  // The child was reaped: nothing of ours is left to wait for.
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(RunCommand, TimeoutKillsTheWholeProcessGroup) {
  const auto pids = temp_file("corral-pids");
  // The shell records itself and a background grandchild, then waits for it.
  auto result =
      run_command({"/bin/sh", "-c",
                   "echo $$ > '" + pids.string() + "'; sleep 30 & echo $! >> '" + pids.string() + "'; wait"},
                  Duration(300));
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::Timeout);
  std::ifstream in(pids);
  pid_t shell = 0;
  pid_t grandchild = 0;
  in >> shell >> grandchild;
  std::filesystem::remove(pids);
  ASSERT_GT(shell, 0);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(process_gone(shell));
  // The orphaned grandchild belongs to init now; wait (bounded) for it to die.
  const long fd = ::syscall(SYS_pidfd_open, grandchild, 0);
  if (fd >= 0) {
    pollfd exited{static_cast<int>(fd), POLLIN, 0};
    EXPECT_EQ(::poll(&exited, 1, 2000), 1);
    ::close(static_cast<int>(fd));
  }
  EXPECT_TRUE(process_gone(grandchild));
}

TEST(RunCommand, StartsTheProgramInItsOwnProcessGroup) {
  auto result = run_command({"/bin/sh", "-c", "echo $$; cut -d' ' -f5 /proc/$$/stat"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  std::istringstream lines(result->out);
  std::string pid;
  std::string pgid;
  lines >> pid >> pgid;
  EXPECT_EQ(pid, pgid);
  EXPECT_NE(pgid, std::to_string(::getpgrp()));
}

TEST(RunCommand, StopsAProgramThatWritesTooMuch) {
  const auto start = steady_clock::now();
  auto result =
      run_command({"/bin/sh", "-c", "while :; do echo yyyyyyyyyyyyyyyyyyyyyyyyyyyyy; done"}, kGenerous, 4096);
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::ResourceExhausted);
  EXPECT_THAT(result.error().message(), HasSubstr("4096 bytes to stdout"));
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(RunCommand, ReadsLargeOutputOnBothStreamsWithoutDeadlock) {
  // More than a pipe holds on each stream, so reading only one at a time would hang.
  auto result =
      run_command({"/bin/sh", "-c", "head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out.size(), 300000u);
  EXPECT_EQ(result->err.size(), 200000u);
}

TEST(RunCommand, GivesTheChildAnEmptyStdin) {
  auto result = run_command({"/bin/cat"}, kGenerous);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out, "");
  EXPECT_EQ(result->exit_code, 0);
}

TEST(RunCommand, DoesNotLeakTheCallersDescriptorsToTheChild) {
  const int fd = ::open("/dev/null", O_RDONLY);  // deliberately without O_CLOEXEC
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(fd, 117), 117);
  auto result =
      run_command({"/bin/sh", "-c", "test -e /proc/self/fd/117 && echo leaked || echo clean"}, kGenerous);
  ::close(117);
  ::close(fd);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out, "clean\n");
}

TEST(RunCommand, TheChildHoldsOnlyStdinStdoutAndStderr) {
  // A socket and a pipe without O_CLOEXEC, as a caller may hold them.
  int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  int fds[2];
  ASSERT_GE(sock, 0);
  ASSERT_EQ(::pipe(fds), 0);
  // ls lists its own descriptors; 3 is the directory it reads them from.
  auto result = run_command({"ls", "/proc/self/fd"}, kGenerous);
  for (int fd : {sock, fds[0], fds[1]}) ::close(fd);
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(result->out, "0\n1\n2\n3\n");
}

TEST(RunCommand, RejectsAnEmptyCommandAndANonPositiveTimeout) {
  auto empty = run_command({}, kGenerous);
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().code(), ErrorCode::InvalidArgument);
  auto zero = run_command({"/bin/true"}, Duration(0));
  ASSERT_FALSE(zero.has_value());
  EXPECT_EQ(zero.error().code(), ErrorCode::InvalidArgument);
}

}  // namespace
}  // namespace corral::agent
