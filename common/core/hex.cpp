#include "common/core/hex.hpp"

#include "common/core/strings.hpp"

namespace corral {

int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

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
    int hi = hex_digit_value(text[i]);
    int lo = hex_digit_value(text[i + 1]);
    if (hi < 0 || lo < 0) {
      std::size_t bad = hi < 0 ? i : i + 1;
      return make_error(ErrorCode::InvalidArgument, "hex text has " + quote_for_message(text.substr(bad, 1)) +
                                                        " at position " + std::to_string(bad));
    }
    out.push_back(static_cast<std::uint8_t>((hi << 4) | lo));
  }
  return out;
}

Result<void> check_nccl_unique_id(std::string_view text) {
  if (text.size() != 2 * kNcclUniqueIdBytes) {
    return make_error(ErrorCode::InvalidArgument, "an NCCL unique ID has " + std::to_string(2 * kNcclUniqueIdBytes) +
                                                      " hex characters, not " + std::to_string(text.size()));
  }
  auto bad = text.find_first_not_of("0123456789abcdef");
  if (bad != std::string_view::npos) {
    return make_error(ErrorCode::InvalidArgument, "an NCCL unique ID is lowercase hex; it has " +
                                                      quote_for_message(text.substr(bad, 1)) + " at position " +
                                                      std::to_string(bad));
  }
  return {};
}

}  // namespace corral
