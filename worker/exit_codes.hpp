#pragma once
// corral-worker's exit codes. The agent maps them to a job's failure reason, so they are
// part of the contract with agent/: never renumber one, only add. worker/README.md has
// the same table for people.

#include <string>
#include <string_view>

namespace corral::worker {

enum class ExitCode : int {
  Ok = 0,
  Internal = 1,            // a bug in corral-worker, or the OS refused something basic
  Usage = 2,               // unknown subcommand or flag, bad flag value
  BadEnvironment = 3,      // the rank environment is missing a variable or contradicts itself
  RendezvousTimeout = 4,   // the peers (or rank 0, or NCCL) did not all arrive before the deadline
  PeerMismatch = 5,        // a peer disagrees (world size, master, job, attempt) or a rank is claimed twice
  PortUnavailable = 6,     // rank 0 cannot listen on MASTER_ADDR:MASTER_PORT (in use, address not local)
  NetworkError = 7,        // MASTER_ADDR does not resolve, or a socket failed unexpectedly
  GpuSupportNotBuilt = 9,  // nccl-root, nccl-check, preflight in a build without CUDA/NCCL
  CudaError = 10,          // a CUDA runtime call failed (includes a driver too old for the runtime)
  NcclError = 11,          // an NCCL call failed
  NoGpu = 12,              // no CUDA driver or no visible device
  WrongResult = 13,        // a kernel or an all-reduce produced wrong values
};

constexpr int to_int(ExitCode code) {
  return static_cast<int>(code);
}

// Why a command failed: the exit code it ends with and the message it prints. Commands
// return it where a failure decides the exit code, which is everywhere in worker/gpu.
struct Failure {
  ExitCode code;
  std::string message;
};

}  // namespace corral::worker
