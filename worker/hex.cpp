#include "worker/hex.hpp"

#include <algorithm>

#include "common/core/hex.hpp"

namespace corral::worker {

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
