// The CLI's settings file: every problem located by file:line:col, unknown keys refused.

#include <gtest/gtest.h>

#include "common/model/client_config_yaml.hpp"

namespace corral::model {
namespace {

TEST(ClientConfig, ReadsUrlTokenAndCa) {
  auto c = parse_client_config("url: https://coord.lab:7433\ntoken: abc123\nca: ca.pem\n", "config.yaml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(*c, (ClientConfig{"https://coord.lab:7433", "abc123", "ca.pem"}));
}

TEST(ClientConfig, AnEmptyFileSetsNothing) {
  auto c = parse_client_config("", "config.yaml");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, ClientConfig{});
  auto comments = parse_client_config("# nothing yet\n", "config.yaml");
  ASSERT_TRUE(comments.has_value());
}

TEST(ClientConfig, ListsEveryProblemWithItsPosition) {
  auto c = parse_client_config("url: http://coord:7433\ntokn: abc\nca:\nurl: https://x:1\n", "config.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(c.error().message(),
            "config.yaml:1:6: url: must be https://HOST:PORT or unix:/PATH, got \"http://coord:7433\"\n"
            "config.yaml:2:1: \"tokn\": unknown setting; did you mean \"token\"?\n"
            "config.yaml:3:1: ca: must not be empty\n"
            "config.yaml:4:1: url: set twice");
}

TEST(ClientConfig, ATokenWithSpacesIsRefused) {
  auto c = parse_client_config("token: \"abc def\"\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "c.yaml:1:8: token: must be visible ASCII characters without spaces");
}

TEST(ClientConfig, AUrlWithoutAPortIsRefused) {
  for (std::string_view url : {"https://coord", "https://coord:", "https://coord:99999", "https://:7433"}) {
    auto c = parse_client_config("url: \"" + std::string(url) + "\"\n", "c.yaml");
    EXPECT_FALSE(c.has_value()) << url;
  }
  EXPECT_TRUE(parse_client_config("url: https://coord:7433/\n", "c.yaml").has_value());
}

TEST(ClientConfig, TheLocalSocketIsAnAbsolutePath) {
  for (std::string_view url : {"unix:/run/corral/coordinator.sock", "unix:///run/corral/coordinator.sock"}) {
    auto c = parse_client_config("url: \"" + std::string(url) + "\"\n", "c.yaml");
    ASSERT_TRUE(c.has_value()) << url << ": " << c.error().message();
    EXPECT_EQ(c->url, url);
  }
  auto too_long = parse_client_config("url: unix:/" + std::string(107, 'x') + "\n", "c.yaml");
  ASSERT_FALSE(too_long.has_value());
  EXPECT_NE(too_long.error().message().find("longer than 107 bytes"), std::string::npos);
  for (std::string_view url : {"unix:", "unix:run/x.sock", "unix://"}) {
    auto c = parse_client_config("url: \"" + std::string(url) + "\"\n", "c.yaml");
    ASSERT_FALSE(c.has_value()) << url;
    EXPECT_NE(c.error().message().find("must be https://HOST:PORT or unix:/PATH"), std::string::npos);
  }
}

TEST(ClientConfig, NotAMapIsRefused) {
  auto c = parse_client_config("- url\n- token\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "c.yaml:1:1: must be a map of settings (url, token, ca)");
}

TEST(ClientConfig, BadYamlIsLocated) {
  auto c = parse_client_config("url: [https://x:1\n", "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_TRUE(c.error().message().starts_with("c.yaml:")) << c.error().message();
}

TEST(ClientConfig, ALargeFileIsRefusedUnread) {
  auto c = parse_client_config(std::string(kMaxClientConfigBytes + 1, '#'), "c.yaml");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.error().message(), "c.yaml: file is 65537 bytes; the limit is 65536");
}

}  // namespace
}  // namespace corral::model
