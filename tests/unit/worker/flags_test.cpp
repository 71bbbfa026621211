#include "worker/flags.hpp"

#include <gtest/gtest.h>

namespace corral::worker {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kKnown[] = {"timeout", "gpus-per-rank"};

Result<Flags> parse(std::vector<std::string> args) {
  return parse_flags(args, kKnown);
}

TEST(Flags, TakesSpaceOrEqualsSeparatedValues) {
  auto flags = parse({"--timeout", "5", "--gpus-per-rank=1"});
  ASSERT_TRUE(flags.has_value()) << flags.error().message();
  EXPECT_EQ(flags->at("timeout"), "5");
  EXPECT_EQ(flags->at("gpus-per-rank"), "1");
}

TEST(Flags, SuggestsTheFlagMeantForATypo) {
  EXPECT_EQ(parse({"--timout", "5"}).error().message(), "unknown flag --timout (did you mean --timeout?)");
}

TEST(Flags, RefusesRepeatsMissingValuesAndStrayWords) {
  EXPECT_EQ(parse({"--timeout", "1", "--timeout=2"}).error().message(), "--timeout is given twice");
  EXPECT_EQ(parse({"--timeout"}).error().message(), "--timeout needs a value");
  EXPECT_EQ(parse({"rank"}).error().message(), "unexpected argument \"rank\"");
}

TEST(Flags, ReadsTimeoutsAsSecondsOrDurations) {
  EXPECT_EQ(parse_timeout("timeout", "60").value(), 60s);
  EXPECT_EQ(parse_timeout("timeout", "0.25").value(), 250ms);
  EXPECT_EQ(parse_timeout("timeout", "2m").value(), 120s);
  EXPECT_EQ(parse_timeout("timeout", "0").error().message(),
            "--timeout \"0\" is not a positive number of seconds");
}

TEST(Flags, ReadsBoundedIntegers) {
  EXPECT_EQ(parse_integer("iters", "20", 1, 100).value(), 20);
  EXPECT_EQ(parse_integer("iters", "0", 1, 100).error().message(),
            "--iters \"0\" is not a whole number from 1 to 100");
}

}  // namespace
}  // namespace corral::worker
