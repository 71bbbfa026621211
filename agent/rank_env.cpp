#include "agent/rank_env.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace corral::agent {

namespace {

using model::has_env;
using model::set_env;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

std::string join_ints(const std::vector<int>& items) {
  std::string out;
  for (int i : items) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

}  // namespace

Env build_rank_env(const protocol::Launch& launch, const protocol::RankSpec& rank, const NodeFacts& facts,
                   const Env& base) {
  Env env = base;
  for (const auto& [k, v] : launch.env) set_env(env, k, v);
  set_env(env, "CUDA_VISIBLE_DEVICES", join_ints(visible_gpus(launch, rank)));
  // corral numbers GPUs as nvidia-smi does, in PCI bus order; CUDA's default order is
  // fastest first, which differs on a node with mixed cards.
  set_env(env, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
  // torchrun's worker environment (torch.distributed.elastic's local agent), name for name.
  set_env(env, "MASTER_ADDR", launch.master_addr);
  set_env(env, "MASTER_PORT", std::to_string(launch.master_port));
  set_env(env, "WORLD_SIZE", std::to_string(launch.world_size));
  set_env(env, "RANK", std::to_string(rank.rank));
  set_env(env, "LOCAL_RANK", std::to_string(rank.local_rank));
  set_env(env, "LOCAL_WORLD_SIZE", std::to_string(launch.local_world_size));
  set_env(env, "GROUP_RANK", std::to_string(rank.node_rank));
  set_env(env, "GROUP_WORLD_SIZE", std::to_string(launch.nodes.size()));
  set_env(env, "ROLE_RANK", std::to_string(rank.rank));
  set_env(env, "ROLE_NAME", "default");
  set_env(env, "ROLE_WORLD_SIZE", std::to_string(launch.world_size));
  set_env(env, "TORCHELASTIC_RESTART_COUNT", std::to_string(launch.attempt));
  set_env(env, "TORCHELASTIC_MAX_RESTARTS", std::to_string(launch.max_restarts));
  set_env(env, "TORCHELASTIC_RUN_ID", std::to_string(launch.job));
  // No agent-side store: init_process_group's env:// makes rank 0 host the TCPStore.
  set_env(env, "TORCHELASTIC_USE_AGENT_STORE", "False");
  // Not torchrun's, but what a Slurm or MPI user looks for.
  set_env(env, "NODE_RANK", std::to_string(rank.node_rank));
  set_env(env, "CORRAL_JOB_ID", std::to_string(launch.job));
  set_env(env, "CORRAL_ATTEMPT", std::to_string(launch.attempt));
  set_env(env, "CORRAL_JOB_NAME", launch.name);
  set_env(env, "CORRAL_NNODES", std::to_string(launch.nodes.size()));
  set_env(env, "CORRAL_NODELIST", join(launch.nodes));
  if (!launch.nccl_id.empty()) set_env(env, "CORRAL_NCCL_UNIQUE_ID", launch.nccl_id);
  // Without these, gloo and NCCL pick the address the hostname resolves to, often
  // 127.0.0.1, and tell ranks on other hosts to connect there.
  if (!facts.interface.empty()) {
    if (!has_env(launch.env, "GLOO_SOCKET_IFNAME")) set_env(env, "GLOO_SOCKET_IFNAME", facts.interface);
    if (!has_env(launch.env, "NCCL_SOCKET_IFNAME")) set_env(env, "NCCL_SOCKET_IFNAME", facts.interface);
  }
  // Several ranks on one node each spawning a thread per core oversubscribe it; torchrun
  // sets 1 for the same reason.
  if (launch.local_world_size > 1 && !has_env(launch.env, "OMP_NUM_THREADS")) set_env(env, "OMP_NUM_THREADS", "1");
  // As torchrun: a failed NCCL collective raises instead of hanging (torch 1.x reads the
  // first name, 2.x the second).
  for (const char* name : {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!has_env(launch.env, name)) set_env(env, name, "1");
  }
  return env;
}

std::vector<int> visible_gpus(const protocol::Launch& launch, const protocol::RankSpec& rank) {
  bool listed = std::any_of(launch.ranks.begin(), launch.ranks.end(), [&](const auto& r) { return r.rank == rank.rank; });
  if (launch.gpus_per_rank || !listed) return rank.gpus;
  // Every rank of the node in local-rank order: LOCAL_RANK's own GPUs come at
  // LOCAL_RANK * (GPUs per rank) of the list, on every rank alike.
  std::vector<const protocol::RankSpec*> local;
  for (const auto& r : launch.ranks) local.push_back(&r);
  std::sort(local.begin(), local.end(), [](const auto* a, const auto* b) { return a->local_rank < b->local_rank; });
  std::vector<int> gpus;
  for (const auto* r : local) gpus.insert(gpus.end(), r->gpus.begin(), r->gpus.end());
  return gpus;
}

std::vector<std::string> to_envp(const Env& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::optional<std::string> interface_for_address(const std::string& address) {
  in_addr v4{};
  in6_addr v6{};
  bool is4 = inet_pton(AF_INET, address.c_str(), &v4) == 1;
  bool is6 = !is4 && inet_pton(AF_INET6, address.c_str(), &v6) == 1;
  if (!is4 && !is6) return std::nullopt;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (is4 && a->ifa_addr->sa_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (sin->sin_addr.s_addr == v4.s_addr) found = a->ifa_name;
    } else if (is6 && a->ifa_addr->sa_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (std::memcmp(&sin6->sin6_addr, &v6, sizeof(v6)) == 0) found = a->ifa_name;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace corral::agent
