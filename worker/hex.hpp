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

// kNcclUniqueIdBytes is NCCL_UNIQUE_ID_BYTES; worker/gpu checks it against nccl.h at
// compile time.
using corral::kNcclUniqueIdBytes;
using NcclUniqueIdBytes = std::array<std::uint8_t, kNcclUniqueIdBytes>;

// CORRAL_NCCL_UNIQUE_ID's value, as check_nccl_unique_id accepts it.
[[nodiscard]] Result<NcclUniqueIdBytes> decode_nccl_unique_id(std::string_view text);

}  // namespace corral::worker
