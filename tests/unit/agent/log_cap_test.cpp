// log_cap with real ranks: a process started through the launcher writes past a small
// cap, on the real file system of the test's temporary folder, and what is left is its
// head, a line saying what was cut, and its latest tail; the log's readers skip the hole
// and carry the cut. A spool that cannot take a write (a full tmpfs) refuses a rank's log.

#include "agent/log_cap.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "agent/launcher.hpp"
#include "agent/log_reader.hpp"
#include "agent/rank_start.hpp"
#include "agent/spool.hpp"
#include "tests/support/temp_dir.hpp"

namespace corral::agent {
namespace {

constexpr std::uint64_t kCap = 64 * 1024;

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// The log as corral logs reads it: slice after slice from where the last one ended.
protocol::LogData read_whole(const std::string& path, std::string& text) {
  protocol::LogRequest request{1, 7, 0, 0, 0, kMaxLogSlice};
  protocol::LogData d;
  for (;;) {
    d = answer_log_request(request, path, false);
    if (!d.error.empty() || d.data.empty()) return d;
    text += d.data;
    request.offset = d.offset + d.data.size();
  }
}

std::uint64_t disk_bytes(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
}

// Starts `command` as a rank would be, its output in `log`.
pid_t start_rank(const std::string& command, const std::string& log) {
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", command};
  spec.envp = {"PATH=/usr/bin:/bin"};
  spec.log_path = log;
  auto pid = spawn(spec);
  EXPECT_TRUE(pid.has_value()) << pid.error().message();
  return pid.value_or(-1);
}

TEST(LogCap, ALogPastTheCapKeepsItsHeadAMarkerAndItsTail) {
  testing::TempDir dir;
  const std::string log = dir.file("rank-0.log");
  // 30000 numbered lines, about 320 KB: five times the cap.
  pid_t pid = start_rank("i=0; while [ $i -lt 30000 ]; do echo \"line $i\"; i=$((i+1)); done", log);
  ASSERT_EQ(wait_status(pid), 0);
  const std::uint64_t written = std::filesystem::file_size(log);
  ASSERT_GT(written, 4 * kCap);
  auto cut = cap_log(log, kCap);
  ASSERT_TRUE(cut.has_value()) << cut.error().message();
  EXPECT_GT(*cut, written - kCap);
  EXPECT_EQ(cap_log(log, kCap).value_or(1), 0u);  // under the cap now: nothing more
  // The blocks went back to the file system; the file's size still counts all it wrote.
  EXPECT_LE(disk_bytes(log), kCap + 16 * 1024);
  EXPECT_EQ(std::filesystem::file_size(log), written);

  std::string text;
  protocol::LogData last = read_whole(log, text);
  EXPECT_EQ(last.error, "");
  EXPECT_EQ(last.cut, *cut);
  EXPECT_LE(text.size(), kCap + 1024);
  EXPECT_EQ(text.find('\0'), std::string::npos);  // the hole is skipped, not read as zeros
  EXPECT_EQ(text.rfind("line 0\nline 1\n", 0), 0u) << text.substr(0, 64);
  const std::string marker = log_cut_marker(*cut);
  EXPECT_EQ(marker, "\n[corral: " + std::to_string(*cut) + " bytes cut from this log]\n");
  ASSERT_NE(text.find(marker), std::string::npos);
  EXPECT_TRUE(text.ends_with("line 29998\nline 29999\n")) << text.substr(text.size() - 64);
}

TEST(LogCap, ARankStillWritingLosesNothingAtTheEndOfItsLog) {
  // The rank writes through its O_APPEND descriptor while the log is cut again and again:
  // its writes land at the end whatever the cuts do, so the tail runs without a gap.
  testing::TempDir dir;
  const std::string log = dir.file("rank-0.log");
  pid_t pid = start_rank("i=0; while [ $i -lt 60000 ]; do echo \"line $i\"; i=$((i+1)); done", log);
  std::uint64_t cuts = 0;
  for (;;) {
    auto cut = cap_log(log, kCap);
    ASSERT_TRUE(cut.has_value()) << cut.error().message();
    cuts += *cut > 0;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
  }
  ASSERT_TRUE(cap_log(log, kCap).has_value());
  EXPECT_GT(cuts, 1u);
  std::string text;
  protocol::LogData last = read_whole(log, text);
  EXPECT_LE(disk_bytes(log), kCap + 16 * 1024);
  const std::string marker = log_cut_marker(last.cut);
  auto at = text.find(marker);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(text.rfind("line 0\n", 0), 0u);
  // After the marker: a line cut in its middle, then every line to the last, in order.
  std::istringstream tail(text.substr(at + marker.size()));
  std::string line;
  std::getline(tail, line);
  long expected = -1;
  while (std::getline(tail, line)) {
    ASSERT_EQ(line.rfind("line ", 0), 0u) << line;
    long n = std::stol(line.substr(5));
    if (expected >= 0) {
      ASSERT_EQ(n, expected);
    }
    expected = n + 1;
  }
  EXPECT_EQ(expected, 60000);
}

TEST(LogCap, AReaderInsideTheHoleGoesOnAfterItAndASliceStopsAtTheMarker) {
  testing::TempDir dir;
  const std::string log = dir.file("rank-0.log");
  std::ofstream(log) << std::string(4 * kCap, 'x');
  auto cut = cap_log(log, kCap);
  ASSERT_TRUE(cut.has_value()) << cut.error().message();
  auto record = read_log_cut(log);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->marker_at, kCap / 2);
  EXPECT_EQ(record->cut, *cut);
  auto head = read_log_slice(log, 0, ~0ULL);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->offset, 0u);
  EXPECT_EQ(head->data, std::string(kCap / 2, 'x') + log_cut_marker(*cut));
  auto inside = read_log_slice(log, record->marker_end + 10, ~0ULL);
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->offset, record->tail_at);
  EXPECT_EQ(inside->data, std::string(4 * kCap - record->tail_at, 'x'));
  EXPECT_EQ(inside->cut, *cut);
}

TEST(LogCap, ALogUnderTheCapOrGoneIsLeftAlone) {
  testing::TempDir dir;
  const std::string log = dir.file("rank-0.log");
  std::ofstream(log) << std::string(kCap, 'x');
  EXPECT_EQ(cap_log(log, kCap).value_or(1), 0u);
  EXPECT_FALSE(read_log_cut(log).has_value());
  EXPECT_EQ(cap_logs({log, dir.file("gone.log")}, kCap), "");
}

// A tmpfs of 4 MiB mounted on a temporary folder (needs root), unmounted at the end.
class SmallSpool {
 public:
  SmallSpool() {
    mounted_ = ::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, "size=4m") == 0;
    why_ = mounted_ ? "" : std::string("cannot mount a tmpfs: ") + std::strerror(errno);
  }
  ~SmallSpool() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }
  std::string path() const { return dir_.path().string(); }
  // Writes a file until the file system refuses.
  void fill() {
    std::ofstream out(dir_.file("filler"), std::ios::binary);
    const std::string block(4096, 'f');
    while (out.write(block.data(), block.size())) out.flush();
  }
  void empty() { std::filesystem::remove(dir_.file("filler")); }

 private:
  testing::TempDir dir_;
  bool mounted_ = false;
  std::string why_;
};

TEST(LogCap, AFullSpoolRefusesARanksLogAndTheRankDoesNotStart) {
  SmallSpool small;
  if (!small.mounted()) GTEST_SKIP() << small.why();
  Spool spool(small.path());
  ASSERT_TRUE(spool.create().has_value());
  EXPECT_EQ(spool.full(), "");
  std::filesystem::create_directories(spool.attempt_dir(5, 0));
  small.fill();
  EXPECT_NE(spool.full().find("the spool " + small.path() + " is full"), std::string::npos) << spool.full();

  protocol::Launch launch;
  launch.job = 5;
  launch.attempt = 0;
  auto self = lookup_user_id(::geteuid());
  ASSERT_TRUE(self.has_value());
  launch.user = self->name;
  launch.command.argv = {"/bin/sh", "-c", "echo lost"};
  launch.ranks.push_back({});
  StartContext context{spool, "", "agent", true, {}};
  StartOutcome out = start_ranks(context, launch, -1);
  EXPECT_TRUE(out.started.empty());
  EXPECT_NE(out.spool_problem.find("No space left on device"), std::string::npos) << out.spool_problem;
  ASSERT_EQ(out.reports.size(), 1u);
  const auto* failed = std::get_if<protocol::RankExited>(&out.reports[0]);
  ASSERT_NE(failed, nullptr);
  EXPECT_TRUE(failed->launch_failure);
  EXPECT_NE(failed->reason.find("cannot take the log " + spool.log_path(5, 0, 0)), std::string::npos)
      << failed->reason;

  small.empty();
  EXPECT_EQ(spool.full(), "");
  EXPECT_TRUE(spool.create_log(5, 0, 1).has_value());
}

}  // namespace
}  // namespace corral::agent
