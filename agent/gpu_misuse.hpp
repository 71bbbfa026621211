#pragma once
// GPU misuse: a rank's process holding memory on a GPU that is not the rank's own, most
// often every rank of a node on GPU 0 because the program never called
// torch.cuda.set_device(LOCAL_RANK). A pure function of what nvidia-smi lists and what
// the agent knows of its ranks, so it is tested on recorded outputs.

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "agent/inventory/nvidia_smi.hpp"
#include "common/model/inventory.hpp"

namespace corral::agent {

struct RankOnGpus {
  int rank = 0;
  std::map<pid_t, std::string> processes;  // its group's processes: pid -> command
  std::vector<int> gpus;                   // its own GPUs, by index
};

struct GpuMisuse {
  int gpu = 0;  // the GPU (index) it uses that is not its own
  std::string text;
};

// For each rank that misuses a GPU, the GPU and the warning to give, e.g. "pid 812 (python3) holds
// memory on GPU 0 (GPU-8b8c...), which is not its own (its GPU: 1); ranks 0, 1, 2 and 3
// all use GPU 0: does the program call torch.cuda.set_device(LOCAL_RANK)?". Stable for
// the same misuse (no memory amounts), so a warning is given once.
std::map<int, GpuMisuse> find_gpu_misuse(const std::vector<RankOnGpus>& ranks, const std::vector<ComputeApp>& apps,
                                           const std::vector<model::Gpu>& node_gpus);

// What still holds any of `uuids`, from nvidia-smi's compute processes, once a job's ranks
// are confirmed dead: "GPU-8b8c... by pid 812", or "... by a process nvidia-smi will not
// name". Empty when the GPUs are free to serve another job.
std::vector<std::string> gpus_still_held(const std::vector<ComputeApp>& apps, const std::vector<std::string>& uuids);

}  // namespace corral::agent
