#pragma once
// corral-worker's subcommands. Each takes the arguments after its name, reads the
// process environment, prints one JSON line to stdout (nccl-root: the ID) and messages
// to stderr, and returns the process exit code (worker/exit_codes.hpp).
//
// tcp-check lives in corral::worker. The GPU commands live in worker/gpu when CUDA and
// NCCL were found, and in gpu_unavailable.cpp otherwise, which says so and returns
// ExitCode::GpuSupportNotBuilt.

#include <span>
#include <string>

namespace corral::worker {

int run_tcp_check(std::span<const std::string> args);
int run_nccl_root(std::span<const std::string> args);
int run_nccl_check(std::span<const std::string> args);
int run_preflight(std::span<const std::string> args);

// Whether this build has the GPU commands; `corral-worker --help` says which.
bool built_with_gpu();

}  // namespace corral::worker
