#include "agent/gpu_misuse.hpp"

#include <algorithm>
#include <set>

#include "common/core/strings.hpp"

namespace corral::agent {

namespace {

std::string list_ints(const std::vector<int>& items) {
  std::vector<std::string> parts;
  for (int i : items) parts.push_back(std::to_string(i));
  if (parts.size() <= 1) return parts.empty() ? "none" : parts.front();
  std::string last = parts.back();
  parts.pop_back();
  return join(parts, ", ") + " and " + last;
}

}  // namespace

std::map<int, GpuMisuse> find_gpu_misuse(const std::vector<RankOnGpus>& ranks, const std::vector<ComputeApp>& apps,
                                           const std::vector<model::Gpu>& node_gpus) {
  std::map<std::string, int> index_of;  // uuid -> index
  for (const auto& g : node_gpus) index_of[g.uuid] = g.index;
  std::map<pid_t, const RankOnGpus*> rank_of;
  for (const auto& r : ranks) {
    for (const auto& [pid, command] : r.processes) rank_of[pid] = &r;
  }
  // Which ranks use each GPU, and each rank's first use of a GPU not its own.
  std::map<int, std::set<int>> users;
  struct Foreign {
    pid_t pid;
    int gpu;
    std::string uuid;
  };
  std::map<int, Foreign> foreign;
  for (const auto& app : apps) {
    if (!app.pid) continue;
    auto r = rank_of.find(*app.pid);
    auto g = index_of.find(app.gpu_uuid);
    if (r == rank_of.end() || g == index_of.end()) continue;
    const RankOnGpus& rank = *r->second;
    users[g->second].insert(rank.rank);
    bool own = std::find(rank.gpus.begin(), rank.gpus.end(), g->second) != rank.gpus.end();
    if (!own && !foreign.contains(rank.rank)) foreign[rank.rank] = {*app.pid, g->second, app.gpu_uuid};
  }
  std::map<int, GpuMisuse> out;
  for (const auto& [rank_id, f] : foreign) {
    const RankOnGpus& rank = *std::find_if(ranks.begin(), ranks.end(), [&](const auto& r) { return r.rank == rank_id; });
    std::string text = "pid " + std::to_string(f.pid) + " (" + rank.processes.at(f.pid) + ") holds memory on GPU " +
                       std::to_string(f.gpu) + " (" + f.uuid + "), which is not its own (its GPU" +
                       (rank.gpus.size() == 1 ? "" : "s") + ": " + list_ints(rank.gpus) + ")";
    const auto& on_it = users[f.gpu];
    if (on_it.size() >= 2) {
      text += "; ranks " + list_ints(std::vector<int>(on_it.begin(), on_it.end())) + " all use GPU " +
              std::to_string(f.gpu) + ": does the program call torch.cuda.set_device(LOCAL_RANK)?";
    }
    out[rank_id] = {f.gpu, std::move(text)};
  }
  return out;
}

std::vector<std::string> gpus_still_held(const std::vector<ComputeApp>& apps, const std::vector<std::string>& uuids) {
  std::vector<std::string> held;
  for (const auto& proc : apps) {
    if (std::find(uuids.begin(), uuids.end(), proc.gpu_uuid) == uuids.end()) continue;
    held.push_back(proc.gpu_uuid +
                   (proc.pid ? " by pid " + std::to_string(*proc.pid) : " by a process nvidia-smi will not name"));
  }
  return held;
}

}  // namespace corral::agent
