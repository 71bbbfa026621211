#include "worker/gpu/kernels.hpp"

namespace corral::worker::gpu {

namespace {

__global__ void add_one(int* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1;
}

}  // namespace

cudaError_t launch_add_one(int* data, int n) {
  constexpr int kThreads = 256;
  add_one<<<(n + kThreads - 1) / kThreads, kThreads>>>(data, n);
  return cudaGetLastError();
}

}  // namespace corral::worker::gpu
