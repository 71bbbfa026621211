#pragma once
// Parses a simulated GPU inventory (configs/sim/*.yaml): what an agent on a machine
// without GPUs (development, CI) reports instead of nvidia-smi's answer. yaml-cpp stays
// inside the .cpp.
//
//   driver: "550.54.15"
//   cuda: "12.4"
//   gpus:
//     - {name: "NVIDIA A100-SXM4-80GB", memory_mb: 81920, count: 8, nvlink: true}
//   compute_apps: apps.csv   # optional
//   utilization: util.csv    # optional
//
// Groups get consecutive indices in file order. Each GPU's UUID is derived from its group
// and index ("GPU-sim-00000000-0000-0000-0000-000000000003"), so it is the same on every
// node that loads the file: unique within a node, like the indices. `nvlink: true`
// joins the group's GPUs all-to-all (an NVSwitch board); groups are never joined.
// `compute_apps` names a file holding what `nvidia-smi --query-compute-apps=pid,gpu_uuid,
// used_memory --format=csv,noheader,nounits` would print (relative to the inventory's
// directory); the agent reads it anew each time it looks at the processes using GPUs,
// and, as nvidia-smi lists only live processes, leaves out the pids that have exited.
// `utilization` likewise names what `nvidia-smi --query-gpu=index,utilization.gpu
// --format=csv,noheader,nounits` would print, read anew each time the hang detector looks.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "common/model/cuda_version.hpp"
#include "common/model/inventory.hpp"

namespace corral::model {

struct SimInventory {
  std::string driver;  // "550.54.15"
  CudaVersion cuda;    // the CUDA version this pretend driver supports
  std::vector<Gpu> gpus;
  std::string compute_apps;  // a file, as written; empty: no process uses a GPU
  std::string utilization;   // a file, as written; empty: utilization unknown

  bool operator==(const SimInventory&) const = default;
};

inline constexpr std::size_t kMaxSimInventoryBytes = 64 * 1024;
inline constexpr int kMaxSimGpus = 64;

// Never throws. InvalidArgument listing every problem, one per line, each
// "file:line:col: field: message" (e.g. "a100x8.yaml:5:30: gpus[0].count: must be an
// integer from 1 to 64, got \"0\""). Unknown fields are rejected, with a suggestion when
// one looks like a typo; at most kMaxSimGpus GPUs in all.
[[nodiscard]] Result<SimInventory> parse_sim_inventory(std::string_view yaml, std::string_view file_name);

}  // namespace corral::model
