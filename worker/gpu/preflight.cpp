// preflight: the node checklist's GPU part (design.md, "Node health"): the driver and
// runtime versions, every visible device's identity, an allocation, and a small kernel
// whose result is checked on the host.

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "worker/commands.hpp"
#include "worker/exit_codes.hpp"
#include "worker/gpu/gpu_status.hpp"
#include "worker/gpu/kernels.hpp"
#include "worker/json_line.hpp"

#ifndef CORRAL_WORKER_HAVE_KERNELS
#define CORRAL_WORKER_HAVE_KERNELS 0
#endif

namespace corral::worker {

namespace {

using gpu::cuda_step;
using gpu::GpuResult;

// Small enough to fit on any card that still works, large enough to span many blocks.
constexpr int kTestInts = 1 << 20;

// nvidia-smi's spelling, so that the agent can match devices with its inventory.
std::string uuid_text(const cudaUUID_t& uuid) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    auto b = static_cast<unsigned char>(uuid.bytes[i]);
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return out;
}

// Fills `json` as it goes, so that a failing device still reports what was learned.
gpu::Step check_device(int device, JsonLine& json) {
  cudaDeviceProp props{};
  CORRAL_GPU_TRY(cuda_step(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties"));
  char bus_id[32] = {};
  CORRAL_GPU_TRY(cuda_step(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device), "cudaDeviceGetPCIBusId"));
  json.add("name", props.name)
      .add("uuid", uuid_text(props.uuid))
      .add("pci_bus_id", bus_id)
      .add("compute_capability", std::to_string(props.major) + "." + std::to_string(props.minor))
      .add("total_memory_bytes", std::uint64_t{props.totalGlobalMem});
  CORRAL_GPU_TRY(cuda_step(cudaSetDevice(device), "cudaSetDevice"));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CORRAL_GPU_TRY(cuda_step(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  json.add("free_memory_bytes", std::uint64_t{free_bytes});

  gpu::DeviceMemory buffer;
  const std::size_t bytes = sizeof(int) * kTestInts;
  CORRAL_GPU_TRY(buffer.allocate(bytes, "the test pattern"));
  std::vector<int> host(kTestInts);
  std::iota(host.begin(), host.end(), 0);
  CORRAL_GPU_TRY(cuda_step(cudaMemcpy(buffer.as<int>(), host.data(), bytes, cudaMemcpyHostToDevice),
                           "cudaMemcpy to device"));
#if CORRAL_WORKER_HAVE_KERNELS
  CORRAL_GPU_TRY(cuda_step(gpu::launch_add_one(buffer.as<int>(), kTestInts), "add_one kernel launch"));
  CORRAL_GPU_TRY(cuda_step(cudaDeviceSynchronize(), "add_one kernel"));
  constexpr int added = 1;
#else
  constexpr int added = 0;
#endif
  std::vector<int> back(kTestInts, -1);
  CORRAL_GPU_TRY(cuda_step(cudaMemcpy(back.data(), buffer.as<int>(), bytes, cudaMemcpyDeviceToHost),
                           "cudaMemcpy to host"));
  for (int i = 0; i < kTestInts; ++i) {
    if (back[static_cast<std::size_t>(i)] != i + added) {
      return std::unexpected(Failure{ExitCode::WrongResult,
                                     "device " + std::to_string(device) + " returned " +
                                         std::to_string(back[static_cast<std::size_t>(i)]) + " at element " +
                                         std::to_string(i) + ", expected " + std::to_string(i + added)});
    }
  }
  json.add("kernel", CORRAL_WORKER_HAVE_KERNELS ? "ok" : "skipped: built without nvcc");
  return {};
}

int finish(JsonLine& json, const std::optional<Failure>& failure) { return print_result(json, "preflight: ", failure); }

}  // namespace

int run_preflight(std::span<const std::string> args) {
  if (!args.empty()) {
    std::fprintf(stderr, "preflight: takes no arguments\n");
    return to_int(ExitCode::Usage);
  }
  JsonLine json;
  json.add("check", "preflight").add("hostname", host_name());
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  json.add("cuda_visible_devices", visible ? std::optional<std::string>(visible) : std::nullopt);

  int driver = 0;
  int runtime = 0;
  if (auto s = cuda_step(cudaDriverGetVersion(&driver), "cudaDriverGetVersion"); !s)
    return finish(json, s.error());
  if (auto s = cuda_step(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion"); !s)
    return finish(json, s.error());
  json.add("runtime_cuda_version", gpu::cuda_version_text(runtime));
  if (driver != 0) {
    json.add("driver_cuda_version", gpu::cuda_version_text(driver));
  } else {
    json.add_null("driver_cuda_version");
  }
  auto count = gpu::count_visible_devices();
  if (!count) return finish(json, count.error());
  json.add("device_count", *count);

  // Every device is checked and reported even after one fails: the operator wants the
  // whole node's picture; the exit code is the first failure's.
  std::optional<Failure> first_failure;
  std::string devices = "[";
  for (int d = 0; d < *count; ++d) {
    JsonLine device;
    device.add("index", d);
    auto checked = check_device(d, device);
    device.add("ok", checked.has_value());
    if (!checked) {
      device.add("error", checked.error().message);
      if (!first_failure) {
        first_failure = checked.error();
        first_failure->message = "device " + std::to_string(d) + ": " + first_failure->message;
      }
    }
    devices += (d == 0 ? "" : ",") + device.str();
  }
  json.add_raw("devices", devices + "]");
  return finish(json, first_failure);
}

bool built_with_gpu() {
  return true;
}

}  // namespace corral::worker
