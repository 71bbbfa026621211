#pragma once
// The tcp-check rendezvous: rank 0 listens on exactly MASTER_ADDR:MASTER_PORT, every
// other rank connects and says who it is, rank 0 checks that the ranks are one job's,
// complete and unique, then releases the barrier with the sum of every rank's value.
// Blocking, single-threaded, plain POSIX sockets with poll(); every wait has the one
// deadline. Runs on the calling thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>

#include "common/core/error.hpp"
#include "worker/rank_env.hpp"

namespace corral::worker {

struct RendezvousOptions {
  // From the start of the rendezvous until every rank has the sum.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Where rank 0 reports what is worth a line in the rank's log (listening, a refused
  // peer, a peer that went away); the message has no prefix and no newline.
  std::function<void(std::string_view)> log;
};

struct RendezvousResult {
  std::int64_t sum = 0;
  // Rank 0: connections refused without failing the job (another job, not corral).
  int refused = 0;
};

// Error codes, which tcp-check maps to exit codes:
//   Timeout      not every rank arrived (or rank 0 never answered) before the deadline
//   Conflict     a peer of this job disagrees, a rank is claimed twice, or rank 0
//                refused this rank (another job's or attempt's rendezvous)
//   Unavailable  rank 0 cannot listen on MASTER_ADDR:MASTER_PORT
//   Internal     a socket call failed in a way no retry fixes
[[nodiscard]] Result<RendezvousResult> run_tcp_rendezvous(const RankEnv& env, std::int64_t value,
                                                          const RendezvousOptions& options);

}  // namespace corral::worker
