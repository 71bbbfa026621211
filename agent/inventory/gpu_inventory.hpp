#pragma once
// What the agent reports as its node's GPUs: read from nvidia-smi, or from a simulated
// inventory file on machines without GPUs. The commands go through an injected runner so
// that the whole path is tested on recorded outputs. Blocking: call it off the event loop.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "agent/inventory/nvidia_smi.hpp"
#include "agent/inventory/run_command.hpp"
#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/model/cuda_version.hpp"
#include "common/model/inventory.hpp"

namespace corral::agent {

struct Inventory {
  std::vector<model::Gpu> gpus;
  model::CudaVersion cuda;  // the highest CUDA version the driver supports
  std::string driver;       // "550.54.15"
  bool simulated = false;   // from a file, not from nvidia-smi: `corral nodes` says so
  // Simulated only: the file standing for nvidia-smi's compute processes; empty if none.
  std::string compute_apps_file;
  std::string utilization_file;
  // Things that did not stop the inventory but an operator should see in the log, e.g.
  // why NVLink is unknown.
  std::vector<std::string> warnings;

  bool operator==(const Inventory&) const = default;
};

// Runs argv with a timeout. run_command is the real one; tests pass recorded outputs.
using CommandRunner = std::function<Result<CommandOutput>(const std::vector<std::string>&, Duration)>;

// run_command with its default output bound.
CommandRunner system_command_runner();

// nvidia-smi takes seconds on a large node whose GPUs are not in persistence mode; much
// longer means the driver is stuck.
inline constexpr Duration kNvidiaSmiTimeout{30'000};

// Runs `nvidia-smi --query-gpu=...`, plain `nvidia-smi` (for the CUDA version) and
// `nvidia-smi topo -m` (for NVLink; a failure there only leaves NVLink unknown and adds
// a warning). Unavailable when nvidia-smi is missing, the driver is not answering (with
// nvidia-smi's own words), or no GPU is listed; InvalidArgument when output is malformed.
[[nodiscard]] Result<Inventory> read_nvidia_inventory(const CommandRunner& run,
                                                      const std::string& nvidia_smi = "nvidia-smi",
                                                      Duration timeout = kNvidiaSmiTimeout);

// The processes using GPUs now (to find strays after a job ends).
[[nodiscard]] Result<std::vector<ComputeApp>> read_compute_apps(const CommandRunner& run,
                                                                const std::string& nvidia_smi = "nvidia-smi",
                                                                Duration timeout = kNvidiaSmiTimeout);

// Each GPU's utilization now, in percent by index (parse_gpu_utilization).
[[nodiscard]] Result<std::map<int, int>> read_gpu_utilization(const CommandRunner& run,
                                                              const std::string& nvidia_smi = "nvidia-smi",
                                                              Duration timeout = kNvidiaSmiTimeout);

// Loads a simulated inventory file (configs/sim/*.yaml). NotFound when it cannot be
// read; InvalidArgument with file:line:col for a bad file.
// The UUIDs carry a hash of `node`, so simulated GPUs are unique across the cluster
// as real ones are.
[[nodiscard]] Result<Inventory> read_simulated_inventory(const std::string& path, std::string_view node = {});

// A simulated node's compute processes: the inventory's compute_apps file, parsed as
// nvidia-smi's output; none when it names no file or the file is missing.
[[nodiscard]] Result<std::vector<ComputeApp>> read_simulated_compute_apps(const std::string& file);
// Its GPUs' utilization: the inventory's utilization file, parsed as nvidia-smi's output;
// none known when it names no file or the file is missing.
[[nodiscard]] Result<std::map<int, int>> read_simulated_gpu_utilization(const std::string& file);

}  // namespace corral::agent
