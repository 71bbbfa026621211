#include "agent/launcher.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/temp_dir.hpp"

namespace corral::agent {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int wait_status(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

TEST(Launcher, RunsInItsOwnProcessGroupWithTheGivenEnvAndLog) {
  testing::TempDir dir;
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out $RANK; echo err >&2; pwd; test $(ps -o pgid= $$) -eq $$ && echo leader"};
  spec.envp = {"RANK=3", "PATH=/usr/bin:/bin"};
  spec.workdir = dir.path().string();
  spec.log_path = dir.file("rank.log");
  auto pid = spawn(spec);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  int status = wait_status(*pid);
  EXPECT_EQ(describe_status(status), "exited with code 0");
  std::string log = slurp(dir.file("rank.log"));
  EXPECT_NE(log.find("out 3\n"), std::string::npos) << log;
  EXPECT_NE(log.find("err\n"), std::string::npos);
  EXPECT_NE(log.find(dir.path().string()), std::string::npos);
  EXPECT_NE(log.find("leader"), std::string::npos);
}

TEST(Launcher, ARankInheritsNoDescriptorOfTheAgentButStdinStdoutAndStderr) {
  // The agent's own descriptors opened without O_CLOEXEC (its link to the coordinator was
  // one): a socket and both ends of a pipe, at numbers nothing else takes.
  int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  int fds[2];
  ASSERT_GE(sock, 0);
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::dup2(sock, 200), 200);
  ASSERT_EQ(::dup2(fds[0], 201), 201);
  ASSERT_EQ(::dup2(fds[1], 202), 202);
  testing::TempDir dir;
  ProcessSpec spec;
  // ls lists its own descriptors; 3 is the directory it reads them from.
  spec.argv = {"/bin/sh", "-c", "exec ls /proc/self/fd"};
  spec.envp = {"PATH=/usr/bin:/bin"};
  spec.log_path = dir.file("rank.log");
  auto pid = spawn(spec);
  for (int fd : {sock, fds[0], fds[1], 200, 201, 202}) ::close(fd);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  EXPECT_EQ(describe_status(wait_status(*pid)), "exited with code 0");
  EXPECT_EQ(slurp(dir.file("rank.log")), "0\n1\n2\n3\n");
}

TEST(Launcher, ABadWorkdirOrCommandIsAnErrorWithTheReason) {
  testing::TempDir dir;
  ProcessSpec spec;
  spec.argv = {"true"};
  spec.envp = {"PATH=/usr/bin:/bin"};
  spec.workdir = "/nonexistent/dir";
  spec.log_path = dir.file("rank.log");
  auto r = spawn(spec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "workdir /nonexistent/dir: No such file or directory");
  // No workdir: the home directory, which an account made by plain `useradd` lacks.
  spec.workdir.clear();
  spec.home = "/nonexistent/home/alice";
  r = spawn(spec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(),
            "home directory /nonexistent/home/alice (the job sets no workdir): No such file or directory");
  spec.home.clear();
  spec.argv = {"no-such-program-corral"};
  r = spawn(spec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "command not found: no-such-program-corral (PATH=/usr/bin:/bin)");
  // A shell command's first program is looked for too: sh alone would only exit 127.
  spec.argv = {"/bin/sh", "-c", "no-such-program-corral --flag && echo hi"};
  spec.require_program = shell_program(spec.argv[2]);
  r = spawn(spec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "command not found: no-such-program-corral (PATH=/usr/bin:/bin)");
}

TEST(Launcher, ProgramsAreLookedUpOnTheJobsPathNotTheAgents) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir.path() / "bin");
  std::string tool = (dir.path() / "bin" / "corral-only-here").string();
  std::ofstream(tool) << "#!/bin/sh\necho found $1\n";
  std::filesystem::permissions(tool, std::filesystem::perms::owner_all);
  ProcessSpec spec;
  spec.argv = {"corral-only-here", "me"};
  spec.envp = {"PATH=" + (dir.path() / "bin").string() + ":/usr/bin:/bin"};
  spec.log_path = dir.file("rank.log");
  auto pid = spawn(spec);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  EXPECT_EQ(WEXITSTATUS(wait_status(*pid)), 0);
  EXPECT_EQ(slurp(spec.log_path), "found me\n");
  // A script without a #! line runs under /bin/sh, as with execvp.
  std::string bare = (dir.path() / "bin" / "corral-bare-script").string();
  std::ofstream(bare) << "echo bare $1\n";
  std::filesystem::permissions(bare, std::filesystem::perms::owner_all);
  spec.argv = {"corral-bare-script", "too"};
  pid = spawn(spec);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  EXPECT_EQ(WEXITSTATUS(wait_status(*pid)), 0);
  EXPECT_EQ(slurp(spec.log_path), "found me\nbare too\n");
}

TEST(Launcher, AShellCommandsProgramIsItsFirstPlainWord) {
  EXPECT_EQ(shell_program("python3 train.py --lr 0.1"), "python3");
  EXPECT_EQ(shell_program("  ./run.sh&& echo done"), "./run.sh");
  EXPECT_EQ(shell_program("/usr/bin/env python3"), "/usr/bin/env");
  // Nothing to look up when the shell decides what runs.
  EXPECT_EQ(shell_program("cd src && python3 x.py"), "");
  EXPECT_EQ(shell_program("FOO=1 python3 x.py"), "");
  EXPECT_EQ(shell_program("$PYTHON x.py"), "");
  EXPECT_EQ(shell_program("\"my prog\" x"), "");
  EXPECT_EQ(shell_program("if true; then echo; fi"), "");
  EXPECT_EQ(shell_program("(sleep 1)"), "");
  EXPECT_EQ(shell_program("   "), "");
}

TEST(Launcher, SignalsReachTheWholeGroup) {
  testing::TempDir dir;
  ProcessSpec spec;
  // A child that outlives its shell unless the whole group is signalled.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  spec.argv = {"/bin/sh", "-c", "sleep 300 & echo started; wait"};
  spec.envp = {"PATH=/usr/bin:/bin"};
  spec.log_path = dir.file("rank.log");
  auto pid = spawn(spec);
  ASSERT_TRUE(pid.has_value());
  EXPECT_TRUE(group_alive(*pid));
  EXPECT_TRUE(signal_group(*pid, SIGKILL));
  int status = wait_status(*pid);
  EXPECT_EQ(describe_status(status).rfind("killed by signal 9", 0), 0u);
  // The orphaned sleep is killed too. As a subreaper (like the agent) this test gets it
  // back and reaps it: then nothing of the group is left, zombies included.
  for (int i = 0; i < 400 && group_alive(*pid); ++i) {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    usleep(5000);
  }
  EXPECT_FALSE(group_alive(*pid));
}

TEST(Launcher, UnknownUserIsNotFound) {
  auto u = lookup_user("no-such-user-corral");
  ASSERT_FALSE(u.has_value());
  EXPECT_EQ(u.error().message(), "no such user no-such-user-corral on this node");
  EXPECT_TRUE(lookup_user("root").has_value());
}

TEST(Launcher, DropsToTheJobsUserWhenRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  auto nobody = lookup_user("nobody");
  ASSERT_TRUE(nobody.has_value());
  testing::TempDir dir;
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "id -u"};
  spec.envp = {"PATH=/usr/bin:/bin"};
  spec.workdir = "/";
  spec.user = *nobody;
  spec.log_path = dir.file("rank.log");
  auto pid = spawn(spec);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  wait_status(*pid);
  EXPECT_EQ(slurp(dir.file("rank.log")), std::to_string(nobody->uid) + "\n");
}

TEST(Launcher, AttemptProcessesFindsWhatLeftTheRanksGroupByItsEnvironment) {
  testing::TempDir dir;
  ProcessSpec spec;
  // The rank starts a process in a session of its own (out of its process group, as a
  // daemonising data loader would) and exits at once.
  spec.argv = {"/bin/sh", "-c", "setsid sleep 60 & echo $! > " + dir.file("escaped.pid")};
  spec.envp = {"PATH=/usr/bin:/bin", "CORRAL_JOB_ID=977", "CORRAL_ATTEMPT=2", "CORRAL_AGENT_ID=test-agent"};
  spec.log_path = dir.file("rank.log");
  auto pid = spawn(spec);
  ASSERT_TRUE(pid.has_value()) << pid.error().message();
  EXPECT_EQ(describe_status(wait_status(*pid)), "exited with code 0");
  // `setsid` runs in the background: wait until it has left the group, which is then empty,
  // so only the environment tells what the process belongs to.
  for (int i = 0; i < 400 && group_alive(*pid); ++i) ::usleep(5000);
  EXPECT_FALSE(group_alive(*pid));
  pid_t escaped = 0;
  std::ifstream(dir.file("escaped.pid")) >> escaped;
  ASSERT_GT(escaped, 0);
  auto found = attempt_processes(977, 2, "test-agent");
  EXPECT_EQ(found, std::vector<pid_t>{escaped});
  EXPECT_TRUE(attempt_processes(977, 3, "test-agent").empty());   // another attempt
  EXPECT_TRUE(attempt_processes(977, 2, "other-agent").empty());  // another agent's rank
  EXPECT_TRUE(attempt_processes(97, 2, "test-agent").empty());    // a prefix of the id is another job
  EXPECT_TRUE(attempt_processes(9770, 2, "test-agent").empty());
  ASSERT_EQ(::kill(escaped, SIGKILL), 0);
  // It is our grandchild, reparented to init (or a subreaper): wait until it is gone.
  for (int i = 0; i < 400 && !attempt_processes(977, 2, "test-agent").empty(); ++i) ::usleep(5000);
  EXPECT_TRUE(attempt_processes(977, 2, "test-agent").empty());
}

TEST(Launcher, AttemptProcessesReadsAProcfsTree) {
  testing::TempDir dir;
  auto proc = [&](const std::string& pid, const std::string& env) {
    std::filesystem::create_directories(dir.path() / pid);
    std::ofstream(dir.path() / pid / "environ") << env;
  };
  using namespace std::string_literals;
  const std::string a = "CORRAL_AGENT_ID=a1\0"s;
  proc("10", "A=1\0CORRAL_JOB_ID=5\0CORRAL_ATTEMPT=0\0"s + a);
  proc("11", a + "CORRAL_ATTEMPT=0\0CORRAL_JOB_ID=5"s);        // last entry without its NUL
  proc("12", "CORRAL_JOB_ID=5\0CORRAL_ATTEMPT=01\0"s + a);    // another attempt
  proc("13", "X_CORRAL_JOB_ID=5\0CORRAL_ATTEMPT=0\0"s + a);   // not the variable itself
  proc("14", "CORRAL_JOB_ID=5\0CORRAL_ATTEMPT=0\0CORRAL_AGENT_ID=a2\0"s);  // another agent's
  proc("self", "CORRAL_JOB_ID=5\0CORRAL_ATTEMPT=0\0"s + a);   // not a pid
  EXPECT_EQ(attempt_processes(5, 0, "a1", dir.path().string()), (std::vector<pid_t>{10, 11}));
  EXPECT_TRUE(attempt_processes(5, 0, "a1", dir.file("nope")).empty());
}

}  // namespace
}  // namespace corral::agent
