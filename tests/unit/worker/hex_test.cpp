#include "worker/hex.hpp"

#include <numeric>

#include <gtest/gtest.h>

namespace corral::worker {
namespace {

TEST(Hex, RoundTripsEveryByteValue) {
  std::vector<std::uint8_t> bytes(256);
  std::iota(bytes.begin(), bytes.end(), 0);
  std::string text = hex_encode(bytes);
  EXPECT_EQ(text.size(), 512u);
  EXPECT_EQ(text.substr(0, 8), "00010203");
  EXPECT_EQ(text.substr(504), "fcfdfeff");
  EXPECT_EQ(hex_decode(text).value(), bytes);
}

TEST(Hex, WritesLowercaseAndReadsEitherCase) {
  EXPECT_EQ(hex_encode(std::vector<std::uint8_t>{0xab, 0xcd}), "abcd");
  EXPECT_EQ(hex_decode("ABcd").value(), (std::vector<std::uint8_t>{0xab, 0xcd}));
}

TEST(Hex, NamesTheFirstBadCharacter) {
  EXPECT_EQ(hex_decode("0g").error().message(), "hex text has \"g\" at position 1");
  EXPECT_EQ(hex_decode("abc").error().message(), "hex text has an odd number of characters (3)");
}

TEST(NcclUniqueId, RoundTripsThroughItsEnvironmentForm) {
  NcclUniqueIdBytes id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(i * 7 + 3);
  std::string text = hex_encode(id);
  ASSERT_EQ(text.size(), 256u);
  EXPECT_EQ(decode_nccl_unique_id(text).value(), id);
}

TEST(NcclUniqueId, RefusesTheWrongLengthOrCharacters) {
  EXPECT_EQ(decode_nccl_unique_id(std::string(254, 'a')).error().message(),
            "CORRAL_NCCL_UNIQUE_ID: an NCCL unique ID has 256 hex characters, not 254");
  std::string bad(256, '0');
  bad[10] = 'z';
  EXPECT_EQ(decode_nccl_unique_id(bad).error().message(),
            "CORRAL_NCCL_UNIQUE_ID: an NCCL unique ID is lowercase hex; it has \"z\" at position 10");
}

}  // namespace
}  // namespace corral::worker
