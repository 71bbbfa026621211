#pragma once
// The environment of one rank, exactly as design.md's worker environment table says:
// what init_process_group(init_method='env://') and native NCCL programs expect.
// Pure: unit-tested without processes.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/model/submission.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

using Env = model::EnvList;

struct NodeFacts {
  std::string interface;  // holds the node's advertised address; empty when unknown
};

// The job's env first, then corral's variables (which the job cannot override, the
// spec parser refuses them), then the defaults the job may override (socket interface,
// OMP_NUM_THREADS). `base` (PATH, HOME, USER, ...) comes first of all.
Env build_rank_env(const protocol::Launch& launch, const protocol::RankSpec& rank, const NodeFacts& facts,
                   const Env& base);

// CUDA_VISIBLE_DEVICES of `rank` (one of launch.ranks): its own GPUs with
// launch.gpus_per_rank, else every GPU of the job on this node, in local-rank order.
std::vector<int> visible_gpus(const protocol::Launch& launch, const protocol::RankSpec& rank);

// "KEY=VALUE" strings for execve.
std::vector<std::string> to_envp(const Env& env);

// The name of the interface that holds `address` (e.g. "eth0", "lo"), if any.
std::optional<std::string> interface_for_address(const std::string& address);

}  // namespace corral::agent
