// The simulated inventory file an agent reads instead of nvidia-smi.
#include <cstdlib>

#include "common/model/sim_inventory_yaml.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto inv = corral::model::parse_sim_inventory(corral::fuzz::text(data, size), "sim.yaml");
  if (!inv && inv.error().message().empty()) std::abort();
  return 0;
}
