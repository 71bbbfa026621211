// Files replaced whole: the reader sees the old file or the new one, with its mode, and
// the temporary file beside it is never followed through a link.

#include "common/core/files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"

namespace corral {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(WriteFileAtomically, ReplacesTheFileWholeWithItsModeWhateverTheUmask) {
  testing::TempDir dir;
  std::string path = dir.file("port");
  std::ofstream(path) << "old and longer";
  mode_t old_umask = ::umask(0077);
  ASSERT_TRUE(write_file_atomically(path, "7433\n", 0644).has_value());
  ::umask(old_umask);
  EXPECT_EQ(read_all(path), "7433\n");
  EXPECT_EQ(mode_of(path), 0644u);
  ASSERT_TRUE(write_file_atomically(path, "secret", 0600, Survives::kill).has_value());
  EXPECT_EQ(read_all(path), "secret");
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(WriteFileAtomically, ALinkOrAStaleFileAtTheTemporaryNameIsReplacedNotFollowed) {
  testing::TempDir dir;
  std::string path = dir.file("tls-session");
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::string target = dir.file("someone-elses");
  std::ofstream(target) << "keep me";
  ::chmod(target.c_str(), 0644);
  std::filesystem::create_symlink(target, tmp);
  ASSERT_TRUE(write_file_atomically(path, "new", 0600).has_value());
  EXPECT_EQ(read_all(path), "new");
  EXPECT_EQ(read_all(target), "keep me") << "written through the link";
  EXPECT_EQ(mode_of(target), 0644u);
  // What a writer killed with the same pid left: replaced too.
  std::ofstream(tmp) << "half of an old";
  ASSERT_TRUE(write_file_atomically(path, "newer", 0600).has_value());
  EXPECT_EQ(read_all(path), "newer");
  EXPECT_FALSE(std::filesystem::exists(tmp));
}

// Two threads of one process (the connection keeper's, each saving a TLS session) never
// write into each other's temporary file: the file is always one of theirs, whole.
TEST(WriteFileAtomically, TwoThreadsWritingTheSamePathEachLeaveAWholeFile) {
  testing::TempDir dir;
  std::string path = dir.file("tls-session");
  const std::string a(64 * 1024, 'a');
  const std::string b(64 * 1024, 'b');
  std::atomic<int> failures{0};
  auto writer = [&](const std::string& text) {
    for (int i = 0; i < 200; ++i) {
      if (!write_file_atomically(path, text, 0600, Survives::kill)) ++failures;
    }
  };
  std::thread ta(writer, a);
  std::thread tb(writer, b);
  for (int i = 0; i < 400; ++i) {
    std::string now = read_all(path);
    if (!now.empty()) EXPECT_TRUE(now == a || now == b) << "a mixed file of " << now.size() << " bytes";
  }
  ta.join();
  tb.join();
  EXPECT_EQ(failures.load(), 0);
  std::string last = read_all(path);
  EXPECT_TRUE(last == a || last == b);
}

TEST(WriteFileAtomically, AFolderThatIsNotThereIsAnErrorNamingThePath) {
  testing::TempDir dir;
  std::string path = dir.file("missing/port");
  auto r = write_file_atomically(path, "x", 0644);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Unavailable);
  EXPECT_EQ(r.error().message(), "cannot write " + path + ": No such file or directory");
}

}  // namespace
}  // namespace corral
