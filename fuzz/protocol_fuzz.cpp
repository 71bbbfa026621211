// The agent protocol's JSON codec, both directions (the first byte picks): what decodes
// encodes and decodes again to the same message.
#include <cstdlib>

#include "common/protocol/codec.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace corral::protocol;
  if (size == 0) return 0;
  auto text = corral::fuzz::text(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    if (auto m = decode_agent_message(text)) {
      std::string again = encode(*m);
      auto back = decode_agent_message(again);
      if (!back || encode(*back) != again) std::abort();
    }
  } else {
    if (auto m = decode_coordinator_message(text)) {
      std::string again = encode(*m);
      auto back = decode_coordinator_message(again);
      if (!back || encode(*back) != again) std::abort();
    }
  }
  return 0;
}
