#include "worker/hex.hpp"

#include <algorithm>

#include "common/core/strings.hpp"

namespace corral::worker {

namespace {

int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string hex_encode(std::span<const std::uint8_t> bytes) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

Result<std::vector<std::uint8_t>> hex_decode(std::string_view text) {
  if (text.size() % 2 != 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "hex text has an odd number of characters (" + std::to_string(text.size()) + ")");
  }
  std::vector<std::uint8_t> out;
  out.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    int hi = nibble(text[i]);
    int lo = nibble(text[i + 1]);
    if (hi < 0 || lo < 0) {
      std::size_t bad = hi < 0 ? i : i + 1;
      return make_error(ErrorCode::InvalidArgument, "hex text has " + quote_for_message(text.substr(bad, 1)) +
                                                        " at position " + std::to_string(bad));
    }
    out.push_back(static_cast<std::uint8_t>((hi << 4) | lo));
  }
  return out;
}

Result<NcclUniqueIdBytes> decode_nccl_unique_id(std::string_view text) {
  if (text.size() != 2 * kNcclUniqueIdBytes) {
    return make_error(ErrorCode::InvalidArgument, "CORRAL_NCCL_UNIQUE_ID has " + std::to_string(text.size()) +
                                                      " characters, not " +
                                                      std::to_string(2 * kNcclUniqueIdBytes));
  }
  auto bytes = hex_decode(text);
  if (!bytes) return std::unexpected(bytes.error().with_context("CORRAL_NCCL_UNIQUE_ID"));
  NcclUniqueIdBytes out{};
  std::copy(bytes->begin(), bytes->end(), out.begin());
  return out;
}

}  // namespace corral::worker
