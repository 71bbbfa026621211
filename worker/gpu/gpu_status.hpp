#pragma once
// Every cudaError_t and ncclResult_t is checked where it is returned: these turn one into
// a Failure that names the call, CUDA's or NCCL's own words and the enum's name, and
// carries the exit code the agent maps to a reason (CudaError, NcclError).

#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "worker/exit_codes.hpp"

namespace corral::worker::gpu {

template <typename T>
using GpuResult = std::expected<T, Failure>;
using Step = GpuResult<void>;

[[nodiscard]] Step cuda_step(cudaError_t status, std::string_view call);
// `comm`, when there is one, adds ncclGetLastError's detail.
[[nodiscard]] Step nccl_step(ncclResult_t status, std::string_view call, ncclComm_t comm = nullptr);

// "13.0" from CUDA's 13000.
std::string cuda_version_text(int version);

// The devices this process may use. No driver, no device: NoGpu; a driver older than
// the runtime: CudaError saying so (the "driver version is insufficient" pitfall).
[[nodiscard]] GpuResult<int> count_visible_devices();

// Device memory freed on every path out; for the worker's few short-lived buffers. A
// failing cudaFree at exit changes nothing the report says, so its result is dropped.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  [[nodiscard]] Step allocate(std::size_t bytes, std::string_view what);
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

}  // namespace corral::worker::gpu

// Returns the failure of a Step (or a GpuResult) from the enclosing function, which must
// return a GpuResult; C++ has no `?`.
#define CORRAL_GPU_TRY(step_expr)                              \
  do {                                                         \
    if (auto corral_step_ = (step_expr); !corral_step_) {      \
      return std::unexpected(std::move(corral_step_.error())); \
    }                                                          \
  } while (false)
