#pragma once
// Parsers for what nvidia-smi prints. Pure functions of text: no processes, no files,
// so every format quirk is tested on outputs recorded from real machines. Any thread.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/inventory/run_command.hpp"
#include "common/core/error.hpp"
#include "common/model/cuda_version.hpp"
#include "common/model/inventory.hpp"

namespace corral::agent {

// The arguments after the program name that produce what each parser reads.
inline constexpr std::array<std::string_view, 2> kQueryGpuArgs = {
    "--query-gpu=index,uuid,name,memory.total,driver_version,pci.bus_id", "--format=csv,noheader,nounits"};
inline constexpr std::array<std::string_view, 2> kQueryComputeAppsArgs = {
    "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"};
inline constexpr std::array<std::string_view, 2> kTopoArgs = {"topo", "-m"};
inline constexpr std::array<std::string_view, 2> kQueryUtilizationArgs = {"--query-gpu=index,utilization.gpu",
                                                                          "--format=csv,noheader,nounits"};

// One line of `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,pci.bus_id`.
struct GpuRow {
  int index = 0;
  std::string uuid;  // "GPU-6f3a..."
  std::string name;  // "NVIDIA A100-SXM4-80GB"
  std::int64_t memory_mib = 0;
  std::string driver;      // "550.54.15"
  std::string pci_bus_id;  // "00000000:07:00.0"

  bool operator==(const GpuRow&) const = default;
};

// One line of `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory`.
struct ComputeApp {
  // Unknown where the driver will not name the process ("[Insufficient Permissions]", seen
  // in a container on a MIG GPU for a process outside it). The GPU is held all the same.
  std::optional<int> pid;
  std::string gpu_uuid;
  // Unknown where the driver will not say (containers, other users' processes: "[N/A]").
  std::optional<std::int64_t> used_memory_mib;

  bool operator==(const ComputeApp&) const = default;
};

// `--format=csv,noheader,nounits` output: one GPU a line, fields split by ", ". Spaces
// around fields, CRLF and blank lines are tolerated. InvalidArgument naming the line for
// a wrong number of fields, a bad number, a required field that reads "[N/A]" or
// "[Not Supported]", or an index or UUID listed twice.
[[nodiscard]] Result<std::vector<GpuRow>> parse_query_gpu(std::string_view csv);

// The highest CUDA version the driver supports, from the header of plain `nvidia-smi`:
// "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |", or from
// 610 on "| NVIDIA-SMI 610.43.02   KMD Version: 610.43.02   CUDA UMD Version: 13.3 |".
// Unavailable when the driver reports "CUDA Version: N/A" (or "Not Found") or is not
// answering; InvalidArgument when the text has no CUDA version at all (drivers before 410).
[[nodiscard]] Result<model::CudaVersion> parse_cuda_version(std::string_view nvidia_smi_banner);

// The driver version from the same header ("550.54.15"; "KMD Version:" from 610 on), for
// cross-checking. Under WSL it differs from the NVIDIA-SMI version printed before it.
[[nodiscard]] Result<std::string> parse_banner_driver(std::string_view nvidia_smi_banner);

// From the matrix of `nvidia-smi topo -m`: for every GPU row, the GPU indices it reaches
// over NVLink (cells "NV1" .. "NV18"), sorted. NIC rows and columns, the affinity
// columns, the legends, tabs and the ANSI underline some drivers put on the header are
// skipped. InvalidArgument when no matrix header is found or a GPU row is short.
[[nodiscard]] Result<std::map<int, std::vector<int>>> parse_topo_nvlink(std::string_view topo_m);

// `--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`.
// Empty output means no process uses a GPU.
[[nodiscard]] Result<std::vector<ComputeApp>> parse_compute_apps(std::string_view csv);

// `--query-gpu=index,utilization.gpu --format=csv,noheader,nounits`: each GPU's index and
// the percent of the driver's last sample period in which a kernel ran on it. A GPU whose
// utilization the driver does not give ("[N/A]", e.g. under MIG) is left out.
[[nodiscard]] Result<std::map<int, int>> parse_gpu_utilization(std::string_view csv);

// Joins the three answers into the model's GPUs, sorted by index: class = (name,
// memory, driver), the driver's CUDA version on every GPU, NVLink peers restricted to
// GPUs that were listed. InvalidArgument when the rows disagree on the driver version.
[[nodiscard]] Result<std::vector<model::Gpu>> assemble_gpus(const std::vector<GpuRow>& rows,
                                                            model::CudaVersion cuda,
                                                            const std::map<int, std::vector<int>>& nvlink);

// True when nvidia-smi's output says the driver (or NVML) is not answering: "NVIDIA-SMI
// has failed because it couldn't communicate with the NVIDIA driver", "Failed to
// initialize NVML: Driver/library version mismatch", "No devices were found", and the like.
bool is_driver_not_answering(std::string_view output);

// The error for an nvidia-smi run that exited non-zero: Unavailable, with the command,
// its exit status and the first lines it printed (nvidia-smi writes its errors to
// stdout), e.g. "`nvidia-smi` exited with status 9: NVIDIA-SMI has failed because ...".
Error nvidia_smi_failure(std::string_view command, const CommandOutput& output);

}  // namespace corral::agent
