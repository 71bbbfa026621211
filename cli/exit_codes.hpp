#pragma once
// The exit codes of `corral`, documented in docs/cli.md. Scripts branch on them: 3 means
// "try again later" (the coordinator is unreachable or refused who we are), 2 means
// "fix the command or the file", 1 means the request was answered with a failure.

#include "cli/views.hpp"
#include "common/core/error.hpp"

namespace corral::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // refused (403/404/409...), or the job did not complete
inline constexpr int kExitUsage = 2;        // bad flags, invalid spec, bad config
inline constexpr int kExitUnreachable = 3;  // connection, TLS or authentication (401) failure
// `corral wait` (as srun): a job that failed with an exit code exits with that code; these
// are for the ends that have none.
inline constexpr int kExitJobTimeout = 124;    // TIMEOUT (as coreutils' timeout)
inline constexpr int kExitJobCancelled = 125;  // CANCELLED
// `corral run` stopped following on Ctrl-C (128 + SIGINT, as a shell reports it).
inline constexpr int kExitInterrupted = 130;

// The exit code for a failed call. Codes are chosen where the failure is classified
// (see api_client.hpp): transport and authentication failures are Unavailable, Timeout
// or Unauthenticated; bad input (ours or the user's) is InvalidArgument.
inline int exit_code_for(const Error& error) {
  switch (error.code()) {
    case ErrorCode::Unavailable:
    case ErrorCode::Timeout:
    case ErrorCode::Unauthenticated:
      return kExitUnreachable;
    case ErrorCode::InvalidArgument:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

// What `corral wait` exits with for a job that ended: 0 COMPLETED; the failing rank's own
// exit code (1-255) for a job that failed with one; kExitJobTimeout, kExitJobCancelled;
// kExitFailed for any other end (NODE_FAIL, a rank killed by a signal). A rank that could
// not be started reports 127, as a shell does.
inline int wait_exit_code(const JobInfo& job) {
  if (job.state == "COMPLETED") return kExitOk;
  if (job.state == "TIMEOUT") return kExitJobTimeout;
  if (job.state == "CANCELLED") return kExitJobCancelled;
  if (job.state == "FAILED" && job.exit_code && *job.exit_code >= 1 && *job.exit_code <= 255) return *job.exit_code;
  return kExitFailed;
}

}  // namespace corral::cli
