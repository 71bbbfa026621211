// The agent's parts that stand alone: holding a master port, the nccl-root child, the
// kill escalation, the sweep of what is left of an attempt, and the log slices. Real
// sockets, real processes, a real event loop.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "agent/spool_health.hpp"
#include "agent/attempt_sweep.hpp"
#include "agent/kill_escalation.hpp"
#include "agent/launcher.hpp"
#include "agent/log_reader.hpp"
#include "agent/master_port.hpp"
#include "agent/nccl_root.hpp"
#include "common/core/hex.hpp"
#include "common/net/blocking_work.hpp"
#include "common/net/event_loop.hpp"
#include "tests/support/eventually.hpp"
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

TEST(NcclRoot, AHeldRootIsKilledWithItsGroupOnReleaseAndItsGroupKeptForTheSweep) {
  testing::TempDir dir;
  std::string id(2 * kNcclUniqueIdBytes, 'b');
  // The root starts a helper in its group, as NCCL's bootstrap threads stand for here.
  auto worker = fake_worker(dir, "echo " + id + "\nsleep 60 &\nexec cat >/dev/null");
  auto child = start_nccl_root(worker, "", dir.file("nccl-root.log"));
  ASSERT_TRUE(child) << child.error().message();
  ASSERT_TRUE(read_nccl_root_id(child->id_fd, child->log_path, 10s));
  NcclRootHold hold;
  EXPECT_FALSE(hold.running());
  EXPECT_EQ(hold.group(), 0);
  hold.hold(*child);
  EXPECT_TRUE(hold.running());
  EXPECT_FALSE(hold.reaped(child->pid + 1)) << "another pid is not the root";
  hold.release();
  EXPECT_FALSE(hold.running());
  EXPECT_EQ(hold.group(), child->pid);
  EXPECT_EQ(WTERMSIG(wait_exit(child->pid)), SIGKILL);
  EXPECT_TRUE(testing::eventually([&] { return !group_alive(child->pid); }, 5s)) << "the helper outlived its root";
  hold.release();  // again: nothing left to do
  EXPECT_FALSE(hold.reaped(child->pid)) << "released: no longer counted as running";
}

TEST(NcclRoot, ARootThatExitedByItselfIsReapedAndItsGroupLetGoOnceEmpty) {
  testing::TempDir dir;
  std::string id(2 * kNcclUniqueIdBytes, 'c');
  // It leaves a process in its group: the group's id stays the job's while that lives.
  std::string left = dir.file("left.pid");
  auto worker = fake_worker(dir, "echo " + id + "\nsleep 30 &\necho $! > " + left + "\nexit 3");
  auto child = start_nccl_root(worker, "", dir.file("nccl-root.log"));
  ASSERT_TRUE(child) << child.error().message();
  NcclRootHold hold;
  hold.hold(*child);
  ASSERT_TRUE(read_nccl_root_id(child->id_fd, child->log_path, 10s));
  EXPECT_EQ(WEXITSTATUS(wait_exit(child->pid)), 3);
  EXPECT_TRUE(hold.reaped(child->pid));
  EXPECT_FALSE(hold.running());
  hold.release();
  EXPECT_EQ(hold.group(), child->pid) << "the sweep still looks at its group while a process is in it";
  pid_t rest = 0;
  std::ifstream(left) >> rest;
  ASSERT_GT(rest, 0);
  ASSERT_EQ(::kill(rest, SIGKILL), 0);
  // Reaped by init (this process is not a subreaper): once it is, the group is empty.
  ASSERT_TRUE(testing::eventually(
      [&] {
        hold.let_go_if_empty();
        return hold.group() == 0;
      },
      5s))
      << "an empty group's id may be any new process's: the sweep must not look at it";
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

TEST(LogReader, AnswersARequestWithItsSliceAndWhetherTheLogIsFinished) {
  testing::TempDir dir;
  std::string path = dir.file("rank-1.log");
  std::ofstream(path) << "epoch 1\nepoch 2\n";
  protocol::LogRequest req;
  req.request = 41;
  req.job = 7;
  req.rank = 1;
  req.offset = 8;
  req.max_bytes = 100;
  auto running = answer_log_request(req, path, true);
  EXPECT_EQ(running.request, 41u);
  EXPECT_EQ(running.offset, 8u);
  EXPECT_EQ(running.data, "epoch 2\n");
  EXPECT_EQ(running.size, 16u);
  EXPECT_FALSE(running.finished);
  EXPECT_TRUE(running.error.empty());
  EXPECT_TRUE(answer_log_request(req, path, false).finished);
  auto missing = answer_log_request(req, dir.file("rank-2.log"), false);
  EXPECT_EQ(missing.error, "no log for job 7 rank 1 on this node");
  EXPECT_TRUE(missing.data.empty());
}

// Reaps every child that exited (the test stands in for the agent, a subreaper).
void reap_children() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

TEST(AttemptSweep, KillsWhatIsLeftInTheGroupsAndWhatLeftThemThenFindsNothingLeft) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  testing::TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  ProcessSpec spec;
  // A rank that left a process in its group and one in a session of its own (found only
  // by its environment), then says so and waits.
  spec.argv = {"/bin/sh", "-c", "setsid sleep 60 & echo $! > " + dir.file("escaped.pid") +
                                    "; sleep 60 & echo ready; exec sleep 60"};
  spec.envp = {"PATH=/usr/bin:/bin", "CORRAL_JOB_ID=981", "CORRAL_ATTEMPT=1", "CORRAL_AGENT_ID=sweep-agent"};
  spec.log_path = dir.file("rank.log");
  spec.stdout_fd = ready[1];
  auto pid = spawn(spec);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  ::close(ready[1]);
  char line[16] = {};
  ASSERT_GT(::read(ready[0], line, sizeof(line)), 0);
  ::close(ready[0]);
  pid_t escaped = 0;
  std::ifstream(dir.file("escaped.pid")) >> escaped;
  ASSERT_GT(escaped, 0);
  ASSERT_TRUE(testing::eventually([&] { return attempt_processes(981, 1, "sweep-agent").size() == 3; }, 5s))
      << "the rank, its child and the escaped process all carry the attempt's environment";

  net::EventLoop loop;
  net::BlockingWork work(loop, 1, "sweep-test");
  std::optional<std::string> left;
  int looks = 0;
  AttemptSweep sweep(
      loop, work, {981, 1, "sweep-agent", {*pid}, "/proc"},
      [&] {
        ++looks;
        reap_children();
      },
      [&](std::string l) {
        left = std::move(l);
        loop.stop();
      });
  sweep.start();
  loop.run();
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(*left, "");
  EXPECT_GE(looks, 2) << "the first look found the group and the escaped process";
  EXPECT_FALSE(group_alive(*pid));
  EXPECT_FALSE(testing::running(escaped));
  EXPECT_TRUE(attempt_processes(981, 1, "sweep-agent").empty());
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
  reap_children();
}

TEST(AttemptSweep, WhatSurvivesEveryLookIsReportedAndADestroyedSweepAnswersNobody) {
  // A procfs tree naming a pid that no process has: "killed" at every look, never gone.
  int max = 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> max;
  pid_t ghost = max - 1;
  while (ghost > 1000 && std::filesystem::exists("/proc/" + std::to_string(ghost))) --ghost;
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() / std::to_string(ghost));
  std::string env = std::string("CORRAL_JOB_ID=982") + '\0' + "CORRAL_ATTEMPT=3" + '\0' + "CORRAL_AGENT_ID=a1" + '\0';
  std::ofstream(dir.path() / std::to_string(ghost) / "environ") << env;

  net::EventLoop loop;
  net::BlockingWork work(loop, 1, "sweep-test");
  std::optional<std::string> left;
  int looks = 0;
  std::atomic<int> kills = 0;  // the ghost's pid may be any process's by now: never signalled
  AttemptSweep sweep(
      loop, work,
      {982, 3, "a1", {}, dir.path().string(), [&](pid_t pid) { kills += pid == ghost; }, std::chrono::milliseconds(1)},
      [&] { ++looks; },
      [&](std::string l) {
        left = std::move(l);
        loop.stop();
      });
  sweep.start();
  loop.run();
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(*left, "pid " + std::to_string(ghost));
  EXPECT_EQ(looks, AttemptSweep::kTries);
  EXPECT_EQ(kills, AttemptSweep::kTries) << "killed at every look";

  bool called = false;
  auto gone = std::make_unique<AttemptSweep>(loop, work,
                                             SweepTarget{982, 3, "a1", {}, dir.path().string(), [](pid_t) {}},
                                             nullptr, [&](std::string) { called = true; });
  gone->start();
  gone.reset();
  // The one worker thread answers in order: once this comes back, so has the sweep's look.
  work.run([] {}, [&] { loop.stop(); });
  loop.run();
  EXPECT_FALSE(called);
}

// SpoolHealth: a launch's failure drains until a look lifts it; a look both sets and lifts.
TEST(SpoolHealth, ALaunchFailureDrainsUntilALookFindsRoomAndOnlyChangesAreReported) {
  SpoolHealth h;
  EXPECT_FALSE(h.launch_failed(""));
  EXPECT_TRUE(h.launch_failed("No space left on device"));
  EXPECT_EQ(h.error(), "spool cannot take rank logs: No space left on device");
  EXPECT_FALSE(h.launch_failed("No space left on device")) << "the same reason again is no change";
  EXPECT_FALSE(h.looked("No space left on device"));
  EXPECT_TRUE(h.looked(""));
  EXPECT_EQ(h.error(), "");
  EXPECT_FALSE(h.looked(""));
}

TEST(SpoolHealth, LostLogsAreKeptNewestFirstUpToTheBoundAndLogsToLookAtAgainAreTakenOnce) {
  SpoolHealth h;
  for (std::size_t i = 0; i <= SpoolHealth::kLostLogsRemembered; ++i) h.lost(static_cast<model::JobId>(i + 1), 0, 0, "full");
  EXPECT_EQ(h.lost_why(1, 0, 0), "") << "the oldest job's is let go past the bound";
  EXPECT_EQ(h.lost_why(2, 0, 0), "full");
  EXPECT_EQ(h.lost_why(2, 0, 1), "");
  h.check_once("a.log");
  EXPECT_EQ(h.take_check_once(), std::vector<std::string>{"a.log"});
  EXPECT_TRUE(h.take_check_once().empty());
  EXPECT_TRUE(h.begin_look());
  EXPECT_FALSE(h.begin_look()) << "one look at a time";
  h.end_look();
  EXPECT_TRUE(h.begin_look());
}

}  // namespace
}  // namespace corral::agent
