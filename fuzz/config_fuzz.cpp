// The coordinator's, the agent's and the client's config files (the first byte picks).
#include <cstdlib>

#include "common/model/client_config_yaml.hpp"
#include "common/model/config.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  auto yaml = corral::fuzz::text(data + 1, size - 1);
  std::string why;
  switch (data[0] % 3) {
    case 0:
      if (auto c = corral::model::parse_coordinator_config(yaml, "coordinator.yaml"); !c) why = c.error().message();
      else why = "ok";
      break;
    case 1:
      if (auto c = corral::model::parse_agent_config(yaml, "agent.yaml"); !c) why = c.error().message();
      else why = "ok";
      break;
    default:
      if (auto c = corral::model::parse_client_config(yaml, "config.yaml"); !c) why = c.error().message();
      else why = "ok";
      break;
  }
  if (why.empty()) std::abort();  // every refusal says why
  return 0;
}
