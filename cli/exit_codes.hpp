#pragma once
// The exit codes of `corral`, documented in docs/cli.md. Scripts branch on them: 3 means
// "try again later" (the coordinator is unreachable or refused who we are), 2 means
// "fix the command or the file", 1 means the request was answered with a failure.

#include "common/core/error.hpp"

namespace corral::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // refused (403/404/409...), or the job did not complete
inline constexpr int kExitUsage = 2;        // bad flags, invalid spec, bad config
inline constexpr int kExitUnreachable = 3;  // connection, TLS or authentication (401) failure

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

}  // namespace corral::cli
