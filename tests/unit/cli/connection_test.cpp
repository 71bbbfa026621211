// Where the CLI finds its coordinator: the settings file, then the environment over it.

#include "cli/connection.hpp"

#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"

namespace corral::cli {
namespace {

class ConnectionTest : public ::testing::Test {
 protected:
  EnvLookup env() {
    return [this](const std::string& name) -> std::optional<std::string> {
      auto it = vars_.find(name);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    };
  }
  void write(const std::filesystem::path& path, const std::string& text) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }

  testing::TempDir dir_;
  std::map<std::string, std::string> vars_;
};

TEST_F(ConnectionTest, TheDefaultFileIsUnderXdgConfigHomeThenHome) {
  vars_["HOME"] = "/home/alice";
  EXPECT_EQ(default_config_path(env()), "/home/alice/.config/corral/config.yaml");
  vars_["XDG_CONFIG_HOME"] = "/xdg";
  EXPECT_EQ(default_config_path(env()), "/xdg/corral/config.yaml");
  vars_.clear();
  EXPECT_EQ(default_config_path(env()), "");
}

TEST_F(ConnectionTest, ReadsTheDefaultFileAndResolvesTheCaAgainstItsFolder) {
  vars_["XDG_CONFIG_HOME"] = dir_.path().string();
  write(dir_.path() / "corral" / "config.yaml", "url: https://coord:7433\ntoken: t0k\nca: certs/ca.pem\n");
  auto s = load_connection_settings(std::nullopt, env());
  ASSERT_TRUE(s.has_value()) << s.error().message();
  EXPECT_EQ(
      *s, (ConnectionSettings{"https://coord:7433", "t0k", (dir_.path() / "corral/certs/ca.pem").string(),
                              (dir_.path() / "corral/tls-session").string()}));
}

TEST_F(ConnectionTest, TheEnvironmentOverridesEachKeyOfTheFile) {
  vars_["HOME"] = dir_.path().string();
  write(dir_.path() / ".config" / "corral" / "config.yaml",
        "url: https://file:1\ntoken: file-token\nca: /file/ca.pem\n");
  vars_["CORRAL_TOKEN"] = "env-token";
  auto s = load_connection_settings(std::nullopt, env());
  ASSERT_TRUE(s.has_value()) << s.error().message();
  std::string session = (dir_.path() / ".config/corral/tls-session").string();
  EXPECT_EQ(*s, (ConnectionSettings{"https://file:1", "env-token", "/file/ca.pem", session}));

  vars_["CORRAL_URL"] = "https://env:2";
  vars_["CORRAL_CA"] = "/env/ca.pem";
  s = load_connection_settings(std::nullopt, env());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (ConnectionSettings{"https://env:2", "env-token", "/env/ca.pem", session}));
}

TEST_F(ConnectionTest, AnEmptyVariableCountsAsUnset) {
  std::string file = dir_.file("c.yaml");
  write(file, "url: https://file:1\ntoken: file-token\nca: /ca.pem\n");
  vars_["CORRAL_TOKEN"] = "";
  auto s = load_connection_settings(file, env());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->token, "file-token");
}

TEST_F(ConnectionTest, TheEnvironmentAloneIsEnoughWithoutAFile) {
  vars_["HOME"] = dir_.path().string();
  vars_["CORRAL_URL"] = "https://env:2";
  vars_["CORRAL_TOKEN"] = "t";
  vars_["CORRAL_CA"] = "ca.pem";
  auto s = load_connection_settings(std::nullopt, env());
  ASSERT_TRUE(s.has_value()) << s.error().message();
  EXPECT_EQ(s->ca, "ca.pem");  // relative to where the command runs, like any path typed in a shell
}

TEST_F(ConnectionTest, AConfigFlagNamingNoFileIsAnError) {
  vars_["CORRAL_URL"] = "https://env:2";
  auto s = load_connection_settings(dir_.file("missing.yaml"), env());
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(s.error().message().starts_with("cannot read " + dir_.file("missing.yaml")))
      << s.error().message();
}

TEST_F(ConnectionTest, AnInvalidFileIsReportedWithItsPath) {
  std::string file = dir_.file("c.yaml");
  write(file, "url: https://x:1\nfoo: bar\n");
  auto s = load_connection_settings(file, env());
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().message(), file + ":2:1: \"foo\": unknown setting");
}

TEST_F(ConnectionTest, TheLocalSocketNeedsNoCa) {
  vars_["HOME"] = dir_.path().string();
  vars_["CORRAL_URL"] = "unix:/run/corral/coordinator.sock";
  vars_["CORRAL_TOKEN"] = "t";
  auto s = load_connection_settings(std::nullopt, env());
  ASSERT_TRUE(s.has_value()) << s.error().message();
  EXPECT_EQ(s->url, "unix:/run/corral/coordinator.sock");
  vars_.erase("CORRAL_TOKEN");
  auto missing = load_connection_settings(std::nullopt, env());
  ASSERT_FALSE(missing.has_value());
  EXPECT_TRUE(missing.error().message().starts_with("not configured: missing token (CORRAL_TOKEN);"))
      << missing.error().message();
}

TEST_F(ConnectionTest, MissingSettingsAreNamed) {
  vars_["HOME"] = dir_.path().string();
  vars_["CORRAL_URL"] = "https://env:2";
  auto s = load_connection_settings(std::nullopt, env());
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(s.error().message(),
            "not configured: missing token (CORRAL_TOKEN), ca (CORRAL_CA); set the variables or write " +
                (dir_.path() / ".config/corral/config.yaml").string());
}

}  // namespace
}  // namespace corral::cli
