#include "agent/spool.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.hpp"

namespace corral::agent {
namespace {

TEST(Spool, KeepsItsAgentIdAcrossProcesses) {
  testing::TempDir dir;
  Spool spool(dir.file("spool"));
  ASSERT_TRUE(spool.create());
  auto first = spool.agent_id();
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_EQ(first->size(), 32u);
  EXPECT_EQ(Spool(dir.file("spool")).agent_id().value(), *first);
}

TEST(Spool, ARunningMarkerIsLeftForTheNextAgentWithThePidsStartTime) {
  testing::TempDir dir;
  Spool spool(dir.file("spool"));
  ASSERT_TRUE(spool.create());
  spool.mark_running(12, 1, 3, ::getpid(), {"GPU-aaaa", "GPU-bbbb"});
  spool.mark_running(12, 1, 4, ::getpid());
  spool.forget(Spool::marker_name(12, 1, 4));
  auto left = spool.leftovers();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(left[0].named);
  EXPECT_EQ(left[0].job, 12);
  EXPECT_EQ(left[0].attempt, 1);
  EXPECT_EQ(left[0].rank, 3);
  EXPECT_EQ(left[0].pid, ::getpid());
  EXPECT_FALSE(left[0].start_time.empty());
  EXPECT_EQ(left[0].gpu_uuids, (std::vector<std::string>{"GPU-aaaa", "GPU-bbbb"}));
  EXPECT_EQ(spool.leftovers().size(), 1u) << "a marker stays until its rank's end is acknowledged";
  spool.forget(left[0].marker);
  EXPECT_TRUE(spool.leftovers().empty());
}

// A marker written before GPUs were kept in it (by an older agent) still reads, with none;
// one written before its rank started has pid 0 and no start time.
TEST(Spool, AMarkerWithoutGpusReadsAsOneWithNone) {
  testing::TempDir dir;
  Spool spool(dir.file("spool"));
  ASSERT_TRUE(spool.create());
  std::ofstream(dir.file("spool/running/7-0-1")) << "4242 123456\n";
  spool.mark_running(7, 0, 2, 0, {"GPU-cccc"});
  auto left = spool.leftovers();
  ASSERT_EQ(left.size(), 2u);
  std::sort(left.begin(), left.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  EXPECT_EQ(left[0].pid, 4242);
  EXPECT_EQ(left[0].start_time, "123456");
  EXPECT_TRUE(left[0].gpu_uuids.empty());
  EXPECT_EQ(left[1].pid, 0);
  EXPECT_EQ(left[1].start_time, "-");
  EXPECT_EQ(left[1].gpu_uuids, std::vector<std::string>{"GPU-cccc"});
}

TEST(Spool, SaysHowARankEndedOrThatItsEndIsUnknown) {
  testing::TempDir dir;
  Spool spool(dir.file("spool"));
  ASSERT_TRUE(spool.create());
  std::filesystem::create_directories(spool.attempt_dir(5, 0));
  EXPECT_FALSE(spool.started_before(5, 0, 1));
  std::ofstream(spool.log_path(5, 0, 1)) << "hello\n";
  EXPECT_TRUE(spool.started_before(5, 0, 1));
  EXPECT_FALSE(spool.recorded_exit(5, 0, 1).has_value());
  auto unknown = spool.ended_before(5, 0, 1);
  EXPECT_EQ(unknown.exit_code, -1);
  EXPECT_NE(unknown.reason.find("its end is unknown"), std::string::npos) << unknown.reason;
  spool.record_exit(protocol::RankExited{5, 0, 1, 0, SIGKILL, "killed by signal 9 (Killed)", false});
  auto known = spool.ended_before(5, 0, 1);
  EXPECT_EQ(known.signal, SIGKILL);
  EXPECT_EQ(known.reason, "killed by signal 9 (Killed)");
  ASSERT_TRUE(spool.recorded_exit(5, 0, 1).has_value());
  EXPECT_EQ(spool.recorded_exit(5, 0, 1)->signal, SIGKILL);
  EXPECT_FALSE(spool.recorded_exit(5, 0, 1)->launch_failure);
  // A rank that could not start is said again as one: the job fails LaunchFailed.
  spool.record_exit(protocol::RankExited{5, 0, 2, 127, 0, "cannot start as user bob: no such file", true});
  auto failed = spool.recorded_exit(5, 0, 2);
  ASSERT_TRUE(failed.has_value());
  EXPECT_TRUE(failed->launch_failure);
  EXPECT_EQ(failed->exit_code, 127);
  EXPECT_EQ(failed->reason, "cannot start as user bob: no such file");
  // An older agent's record, without the flag.
  std::ofstream(spool.log_path(5, 0, 3) + ".exit") << "3 0\nexited with code 3\n";
  auto old = spool.recorded_exit(5, 0, 3);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->exit_code, 3);
  EXPECT_FALSE(old->launch_failure);
  EXPECT_EQ(old->reason, "exited with code 3");
}

TEST(Spool, NamesTheFolderItCannotCreate) {
  testing::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  auto made = Spool(dir.file("file") + "/spool").create();
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().message().find("cannot create spool " + dir.file("file") + "/spool/jobs"), std::string::npos)
      << made.error().message();
}

}  // namespace
}  // namespace corral::agent
