#pragma once
// Hex text for binary blobs, chiefly the 128-byte ncclUniqueId that travels from
// nccl-root through the coordinator to every rank as CORRAL_NCCL_UNIQUE_ID.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"

namespace corral::worker {

// NCCL_UNIQUE_ID_BYTES; worker/gpu checks it against nccl.h at compile time.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;
using NcclUniqueIdBytes = std::array<std::uint8_t, kNcclUniqueIdBytes>;

// Lowercase, two characters a byte.
std::string hex_encode(std::span<const std::uint8_t> bytes);

// Accepts either case. The error names what is wrong (odd length, the first bad
// character and its position) without echoing a whole ID into logs.
[[nodiscard]] Result<std::vector<std::uint8_t>> hex_decode(std::string_view text);

// CORRAL_NCCL_UNIQUE_ID's value: exactly 256 hex characters.
[[nodiscard]] Result<NcclUniqueIdBytes> decode_nccl_unique_id(std::string_view text);

}  // namespace corral::worker
