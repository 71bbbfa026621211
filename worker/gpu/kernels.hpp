#pragma once
// The one kernel preflight runs, behind a plain C++ declaration so that only kernels.cu
// needs nvcc. Without nvcc it is not built, and preflight (compiled with
// CORRAL_WORKER_HAVE_KERNELS=0) checks memory copies only and says so.

#include <cuda_runtime_api.h>

namespace corral::worker::gpu {

// Adds one to each of data[0..n) on the current device's default stream; returns the
// launch's error (the kernel's own errors surface at the next synchronisation).
cudaError_t launch_add_one(int* data, int n);

}  // namespace corral::worker::gpu
