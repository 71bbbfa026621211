// The GPU commands of a build without CUDA/NCCL: they say so and exit with
// ExitCode::GpuSupportNotBuilt, which the agent reports as a node problem, not a job's.

#include <cstdio>

#include "worker/commands.hpp"
#include "worker/exit_codes.hpp"

namespace corral::worker {

namespace {

int unavailable(const char* command) {
  std::fprintf(stderr, "corral-worker: built without CUDA/NCCL; %s is unavailable\n", command);
  return to_int(ExitCode::GpuSupportNotBuilt);
}

}  // namespace

int run_nccl_root(std::span<const std::string>) {
  return unavailable("nccl-root");
}
int run_nccl_check(std::span<const std::string>) {
  return unavailable("nccl-check");
}
int run_preflight(std::span<const std::string>) {
  return unavailable("preflight");
}
bool built_with_gpu() {
  return false;
}

}  // namespace corral::worker
