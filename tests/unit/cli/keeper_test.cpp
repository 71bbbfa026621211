// Where the connection keeper is looked for, and when it is not used at all.

#include "cli/keeper.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"

namespace corral::cli {
namespace {

EnvLookup lookup(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(KeeperUse, ComesFromTheEnvironment) {
  auto use = keeper_use(lookup({{"XDG_RUNTIME_DIR", "/run/user/1000"}}));
  EXPECT_EQ(use.dir, "/run/user/1000/corral");
  EXPECT_EQ(use.idle_seconds, 600);
  EXPECT_TRUE(use.may_start);
  EXPECT_EQ(keeper_use(lookup({})).dir, "/tmp/corral-" + std::to_string(::geteuid()));
  EXPECT_EQ(keeper_use(lookup({{"CORRAL_KEEP_CONNECTION", "30"}})).idle_seconds, 30);
  EXPECT_EQ(keeper_use(lookup({{"CORRAL_KEEP_CONNECTION", "soon"}})).idle_seconds, 600);
  EXPECT_EQ(keeper_use(lookup({{"CORRAL_KEEP_CONNECTION", "0"}})).dir, "");
  EXPECT_EQ(keeper_use(lookup({{"CORRAL_KEEP_CONNECTION", "off"}})).dir, "");
  // Inside a job a keeper is used, never started: it would outlive the job's processes.
  auto in_job = keeper_use(lookup({{"CORRAL_JOB_ID", "7"}}));
  EXPECT_NE(in_job.dir, "");
  EXPECT_FALSE(in_job.may_start);
}

TEST(KeeperSocket, OnlyInAFolderOfTheUsersOwnThatNobodyElseCanEnter) {
  testing::TempDir dir;
  std::string ca = dir.file("ca.pem");
  std::ofstream(ca) << "a CA";
  ConnectionSettings settings{"https://coord:7433", "t0k", ca};
  KeeperUse use{.dir = dir.file("run/corral")};
  // The folder's parent is missing: no keeper.
  EXPECT_EQ(keeper_socket(use, settings), "");
  std::filesystem::create_directories(dir.file("run"));
  std::string socket = keeper_socket(use, settings);
  ASSERT_TRUE(socket.starts_with(use.dir + "/keeper-")) << socket;
  struct stat st {};
  ASSERT_EQ(::stat(use.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "made for the user alone";
  EXPECT_EQ(keeper_socket(use, settings), socket) << "the same settings, the same keeper";

  // Another coordinator, or another CA, or the same CA file renewed: another keeper.
  EXPECT_NE(keeper_socket(use, ConnectionSettings{"https://other:7433", "t0k", ca}), socket);
  std::ofstream(ca) << "the renewed CA";
  EXPECT_NE(keeper_socket(use, settings), socket);
  // A unix: URL needs none; a CA that is not there, none either.
  EXPECT_EQ(keeper_socket(use, ConnectionSettings{"unix:/run/corral.sock", "t0k", ""}), "");
  EXPECT_EQ(keeper_socket(use, ConnectionSettings{"https://coord:7433", "t0k", dir.file("none.pem")}), "");

  // A folder others can enter, or a link to one: none.
  ASSERT_EQ(::chmod(use.dir.c_str(), 0711), 0);
  EXPECT_EQ(keeper_socket(use, settings), "");
  ASSERT_EQ(::chmod(use.dir.c_str(), 0700), 0);
  std::filesystem::create_symlink(use.dir, dir.file("run/link"));
  EXPECT_EQ(keeper_socket(KeeperUse{.dir = dir.file("run/link")}, settings), "");
  EXPECT_EQ(keeper_socket(KeeperUse{}, settings), "") << "turned off";
}

}  // namespace
}  // namespace corral::cli
