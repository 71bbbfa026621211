#pragma once
// The 128-byte ncclUniqueId as hex text (common/core/hex.hpp) that travels from
// nccl-root through the coordinator to every rank as CORRAL_NCCL_UNIQUE_ID.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/hex.hpp"

namespace corral::worker {

// NCCL_UNIQUE_ID_BYTES; worker/gpu checks it against nccl.h at compile time.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;
using NcclUniqueIdBytes = std::array<std::uint8_t, kNcclUniqueIdBytes>;

// CORRAL_NCCL_UNIQUE_ID's value: exactly 256 hex characters.
[[nodiscard]] Result<NcclUniqueIdBytes> decode_nccl_unique_id(std::string_view text);

}  // namespace corral::worker
