#include "worker/json_line.hpp"

#include <cmath>

#include <gtest/gtest.h>

namespace corral::worker {
namespace {

TEST(JsonLine, KeepsFieldsInOrderWithTheirTypes) {
  JsonLine json;
  json.add("check", "tcp")
      .add("rank", 3)
      .add("ok", true)
      .add("devices", std::optional<std::string>())
      .add("bw", 1.5, 2);
  EXPECT_EQ(json.str(), R"({"check":"tcp","rank":3,"ok":true,"devices":null,"bw":1.50})");
}

TEST(JsonLine, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(json_quote("a\"b\\c\nd\x01"), R"("a\"b\\c\nd\u0001")");
}

TEST(JsonLine, WritesNullForNumbersJsonCannotHold) {
  JsonLine json;
  json.add("x", std::nan(""));
  EXPECT_EQ(json.str(), R"({"x":null})");
}

}  // namespace
}  // namespace corral::worker
