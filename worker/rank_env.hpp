#pragma once
// The rank environment that the agent (or torchrun) gives a worker, parsed and checked
// for consistency. Pure: reads an EnvMap, never the process environment itself, so each
// inconsistency has a unit test with its exact message.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"

namespace corral::worker {

using EnvMap = std::map<std::string, std::string, std::less<>>;

// More ranks than one rank 0 should hold sockets for; corral's clusters are far smaller.
inline constexpr int kMaxWorldSize = 4096;

struct RankEnv {
  int world_size = 0;
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int node_rank = 0;
  int group_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::int64_t job_id = 0;
  int attempt = 0;
  int nnodes = 0;
  std::vector<std::string> nodelist;
  // Unset is not the same as empty: unset means "every GPU", empty means "none".
  std::optional<std::string> cuda_visible_devices;
  std::vector<std::string> visible_devices;
};

struct RankEnvOptions {
  // When set, CUDA_VISIBLE_DEVICES must list exactly this many devices (0: unset or
  // empty). When not set, the count is not checked, only the list's form.
  std::optional<int> gpus_per_rank;
};

// The variables parse_rank_env reads, in the order their absence is reported.
std::vector<std::string_view> rank_env_names();

// Parses and cross-checks the rank environment. An empty value counts as missing, except
// for CUDA_VISIBLE_DEVICES. The error (InvalidArgument) names the variables and values
// that disagree, e.g. "WORLD_SIZE=4 but RANK=7".
[[nodiscard]] Result<RankEnv> parse_rank_env(const EnvMap& env, const RankEnvOptions& options = {});

// The rank variables and CORRAL_NCCL_UNIQUE_ID as this process sees them.
EnvMap read_process_env();

}  // namespace corral::worker
