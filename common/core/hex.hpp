#pragma once
// Hex text for binary data: tokens, digests, NCCL unique IDs, URL escapes.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"

namespace corral {

// 0..15 for a hex digit of either case, -1 for anything else.
int hex_digit_value(char c);

// Lowercase, two characters a byte.
std::string hex_encode(std::span<const std::uint8_t> bytes);

// Accepts either case. The error names what is wrong (odd length, the first bad
// character and its position) without echoing the whole text into logs.
[[nodiscard]] Result<std::vector<std::uint8_t>> hex_decode(std::string_view text);

// The 128-byte ncclUniqueId (NCCL_UNIQUE_ID_BYTES) as corral carries it from nccl-root
// through the coordinator to every rank: 256 lowercase hex characters. The one check of
// that form; InvalidArgument naming the length or the first bad character.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;
[[nodiscard]] Result<void> check_nccl_unique_id(std::string_view text);

}  // namespace corral
