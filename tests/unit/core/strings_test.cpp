#include "common/core/strings.hpp"

#include <gtest/gtest.h>

#include <array>

namespace corral {
namespace {

using namespace std::chrono_literals;

TEST(ParseDuration, AcceptsEachUnitAndCombinations) {
  EXPECT_EQ(parse_duration("90s").value(), 90s);
  EXPECT_EQ(parse_duration("30m").value(), 30min);
  EXPECT_EQ(parse_duration("2h").value(), 2h);
  EXPECT_EQ(parse_duration("1d").value(), 24h);
  EXPECT_EQ(parse_duration("1h30m").value(), 90min);
  EXPECT_EQ(parse_duration("250ms").value(), 250ms);
}

TEST(ParseDuration, RejectsMissingUnitZeroAndGarbage) {
  EXPECT_FALSE(parse_duration("90").has_value());
  EXPECT_FALSE(parse_duration("0s").has_value());
  EXPECT_FALSE(parse_duration("").has_value());
  EXPECT_FALSE(parse_duration("2 hours").has_value());
  EXPECT_FALSE(parse_duration("-5m").has_value());
  EXPECT_FALSE(parse_duration("400d").has_value());
  EXPECT_EQ(parse_duration("90").error().message(), "missing unit (s, m, h or d) in duration \"90\"");
}

TEST(ParseMoment, ADurationBackADayATimeOrRfc3339) {
  const TimePoint now = *parse_rfc3339("2026-12-04T18:00:00Z");
  EXPECT_EQ(parse_moment("2d", now).value(), *parse_rfc3339("2026-12-02T18:00:00Z"));
  EXPECT_EQ(parse_moment("2026-12-01", now).value(), *parse_rfc3339("2026-12-01T00:00:00Z"));
  EXPECT_EQ(parse_moment("2026-12-01T10:30", now).value(), *parse_rfc3339("2026-12-01T10:30:00Z"));
  EXPECT_EQ(parse_moment("2026-12-01T10:30:05+01:00", now).value(), *parse_rfc3339("2026-12-01T09:30:05Z"));
  for (const char* bad : {"", "yesterday", "2026-13-01", "-2d", "2026-12-01T10"}) {
    auto r = parse_moment(bad, now);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.error().message().find("expected a duration back from now"), std::string::npos);
  }
}

TEST(FormatDuration, RoundTripsThroughParse) {
  for (auto d : {Duration(90s), Duration(90min), Duration(26h), Duration(1500ms)}) {
    EXPECT_EQ(parse_duration(format_duration(d)).value(), d) << format_duration(d);
  }
  EXPECT_EQ(format_duration(5400s), "1h30m");
}

TEST(BaseName, WhatFollowsTheLastSlash) {
  EXPECT_EQ(base_name("/usr/bin/python3.11"), "python3.11");
  EXPECT_EQ(base_name("torchrun"), "torchrun");
  EXPECT_EQ(base_name("./bin/"), "");
  EXPECT_EQ(base_name(""), "");
}

TEST(GlobMatch, MatchesStarQuestionAndClasses) {
  EXPECT_TRUE(glob_match("NVIDIA A100*", "NVIDIA A100-SXM4-80GB"));
  EXPECT_FALSE(glob_match("NVIDIA A100*", "NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(glob_match("NVIDIA H?00*", "NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(glob_match("*[AH]100*", "NVIDIA H100 80GB HBM3"));
  EXPECT_FALSE(glob_match("*[!AH]100*", "NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(glob_match("exact", "exact"));
  EXPECT_FALSE(glob_match("exact", "exactly"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a[b", "a[b"));
}

TEST(ClosestMatch, SuggestsNearTyposOnly) {
  constexpr std::array<std::string_view, 3> kFields = {"gpus_per_node", "nodes", "gpus"};
  EXPECT_EQ(closest_match("gpu_per_node", kFields).value(), "gpus_per_node");
  EXPECT_EQ(closest_match("node", kFields).value(), "nodes");
  EXPECT_FALSE(closest_match("walltime", kFields).has_value());
}

TEST(QuoteForMessage, EscapesControlCharactersAndTruncates) {
  EXPECT_EQ(quote_for_message("four"), "\"four\"");
  EXPECT_EQ(quote_for_message("a\nb\x01"), "\"a\\nb\\x01\"");
  EXPECT_EQ(quote_for_message(std::string(50, 'x')), "\"" + std::string(40, 'x') + "...\"");
}

}  // namespace
}  // namespace corral
