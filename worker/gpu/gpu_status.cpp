#include "worker/gpu/gpu_status.hpp"

#include <cstdlib>
#include <string>

#include "common/core/check.hpp"
#include "common/core/strings.hpp"

namespace corral::worker::gpu {

Step cuda_step(cudaError_t status, std::string_view call) {
  if (status == cudaSuccess) return {};
  // A sticky error stays until the context is reset; clearing the non-sticky ones keeps
  // the next call's error its own.
  (void)cudaGetLastError();
  return std::unexpected(Failure{ExitCode::CudaError, std::string(call) + ": " + cudaGetErrorString(status) +
                                                          " (" + cudaGetErrorName(status) + ")"});
}

Step nccl_step(ncclResult_t status, std::string_view call, ncclComm_t comm) {
  if (status == ncclSuccess) return {};
  std::string message = std::string(call) + ": " + ncclGetErrorString(status) + " (ncclResult_t " +
                        std::to_string(static_cast<int>(status)) + ")";
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') message += ": " + std::string(detail);
  return std::unexpected(Failure{ExitCode::NcclError, std::move(message)});
}

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

GpuResult<int> count_visible_devices() {
  int driver = 0;
  int runtime = 0;
  CORRAL_GPU_TRY(cuda_step(cudaDriverGetVersion(&driver), "cudaDriverGetVersion"));
  CORRAL_GPU_TRY(cuda_step(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion"));
  if (driver == 0) {
    return std::unexpected(
        Failure{ExitCode::NoGpu, "no CUDA driver is installed (libcuda.so.1 cannot be loaded)"});
  }
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) {
    (void)cudaGetLastError();
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return std::unexpected(
        Failure{ExitCode::NoGpu, "no CUDA device is visible (CUDA_VISIBLE_DEVICES=" +
                                     (visible ? quote_for_message(visible) : "unset") + ")"});
  }
  if (status == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    return std::unexpected(
        Failure{ExitCode::CudaError, "the driver supports CUDA " + cuda_version_text(driver) +
                                         " but corral-worker was built with CUDA " +
                                         cuda_version_text(runtime) + ": driver version is insufficient"});
  }
  CORRAL_GPU_TRY(cuda_step(status, "cudaGetDeviceCount"));
  return count;
}

Step DeviceMemory::allocate(std::size_t bytes, std::string_view what) {
  CORRAL_CHECK(ptr_ == nullptr);
  return cuda_step(cudaMalloc(&ptr_, bytes),
                   "cudaMalloc(" + std::to_string(bytes) + " bytes for " + std::string(what) + ")");
}

}  // namespace corral::worker::gpu
