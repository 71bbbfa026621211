#pragma once
// Starting an attempt's ranks on this node: the user looked up, the attempt's folder
// made, each rank's clean login-like environment built and its process spawned, its
// spool marker written. Everything here may block (NSS, fork and exec, the disk), so it
// runs on the agent's launch thread; the agent applies the outcome on its loop.

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "agent/spool.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

struct StartContext {
  Spool spool;
  std::string interface;   // holds the advertised address; "" when none does
  std::string agent_id;    // CORRAL_AGENT_ID of the ranks started here
  bool allow_root_jobs = false;
  std::map<int, std::string> gpu_uuids;  // the node's GPUs, index -> UUID, for the markers
};

struct StartedRank {
  int rank = 0;
  pid_t pid = 0;
  std::string log;
  std::vector<int> gpus;
  std::vector<std::string> gpu_uuids;  // the same GPUs, as its marker keeps them
};

struct StartOutcome {
  // For the coordinator, in rank order: RankStarted for each rank started, RankExited
  // for one that could not start or was started here before.
  std::vector<protocol::AgentMessage> reports;
  std::vector<StartedRank> started;
  // Why the spool could not take a rank's log (the ranks it refused failed to start), or "".
  std::string spool_problem;
};

// Starts every rank of `launch` that was never started here. `probe_fd` (the master
// port held since Prepare, or -1) is closed just before rank 0 starts, which binds the
// port itself.
StartOutcome start_ranks(const StartContext& context, const protocol::Launch& launch, int probe_fd);

}  // namespace corral::agent
