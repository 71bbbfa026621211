#include "agent/launcher.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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

TEST(Launcher, ABadWorkdirOrCommandIsAnErrorWithTheReason) {
  testing::TempDir dir;
  ProcessSpec spec;
  spec.argv = {"true"};
  spec.envp = {"PATH=/usr/bin:/bin"};
  spec.workdir = "/nonexistent/dir";
  spec.log_path = dir.file("rank.log");
  auto r = spawn(spec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "chdir /nonexistent/dir: No such file or directory");
  spec.workdir.clear();
  spec.argv = {"no-such-program-corral"};
  r = spawn(spec);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(), "exec no-such-program-corral: No such file or directory");
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

}  // namespace
}  // namespace corral::agent
