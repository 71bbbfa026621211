// nvidia-smi's outputs as the agent parses them (the first byte picks the parser): the
// GPU query, the banner (CUDA version, driver), the topology matrix, the compute apps;
// rows that parse are assembled into GPUs as the inventory does.
#include <cstdlib>

#include "agent/inventory/nvidia_smi.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace corral::agent;
  if (size == 0) return 0;
  auto text = corral::fuzz::text(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      if (auto rows = parse_query_gpu(text)) (void)assemble_gpus(*rows, {}, {{0, {1}}, {1, {0}}});
      break;
    case 1:
      (void)parse_cuda_version(text);
      break;
    case 2:
      (void)parse_banner_driver(text);
      break;
    case 3:
      (void)parse_topo_nvlink(text);
      break;
    default:
      (void)parse_compute_apps(text);
      break;
  }
  return 0;
}
