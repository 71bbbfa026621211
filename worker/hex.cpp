#include "worker/hex.hpp"

#include <algorithm>

#include "common/core/hex.hpp"

namespace corral::worker {

Result<NcclUniqueIdBytes> decode_nccl_unique_id(std::string_view text) {
  if (auto ok = check_nccl_unique_id(text); !ok) return std::unexpected(ok.error().with_context("CORRAL_NCCL_UNIQUE_ID"));
  auto bytes = hex_decode(text);
  if (!bytes) return std::unexpected(bytes.error().with_context("CORRAL_NCCL_UNIQUE_ID"));
  NcclUniqueIdBytes out{};
  std::copy(bytes->begin(), bytes->end(), out.begin());
  return out;
}

}  // namespace corral::worker
