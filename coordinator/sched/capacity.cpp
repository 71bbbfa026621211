#include "coordinator/sched/capacity.hpp"

#include "common/core/check.hpp"

namespace corral::sched {

namespace {
const std::set<int> kEmptySet;
}

Capacity::Capacity(int num_nodes, int num_classes)
    : num_classes_(num_classes),
      free_(static_cast<std::size_t>(num_nodes) * static_cast<std::size_t>(num_classes), 0),
      buckets_(static_cast<std::size_t>(num_classes)),
      at_least_(static_cast<std::size_t>(num_classes)),
      free_total_(static_cast<std::size_t>(num_classes), 0),
      max_count_(static_cast<std::size_t>(num_classes), 0) {}

void Capacity::move_bucket(int node, int cls, int from, int to) {
  auto c = static_cast<std::size_t>(cls);
  auto& buckets = buckets_[c];
  auto& at_least = at_least_[c];
  if (static_cast<int>(buckets.size()) <= to) {
    buckets.resize(static_cast<std::size_t>(to) + 1);
    at_least.resize(static_cast<std::size_t>(to) + 1, 0);
    max_count_[c] = std::max(max_count_[c], to);
  }
  if (from > 0) buckets[static_cast<std::size_t>(from)].erase(node);
  if (to > 0) buckets[static_cast<std::size_t>(to)].insert(node);
  // at_least[k] counts nodes with count >= k; only the boundary between from and to moves.
  if (to > from) {
    for (int k = from + 1; k <= to; ++k) ++at_least[static_cast<std::size_t>(k)];
  } else {
    for (int k = to + 1; k <= from; ++k) --at_least[static_cast<std::size_t>(k)];
  }
}

void Capacity::add_free(int node, int cls, int pos) {
  GpuMask& mask = free_[index(node, cls)];
  GpuMask bit = GpuMask{1} << pos;
  if (mask & bit) return;
  int before = popcount(mask);
  mask |= bit;
  ++free_total_[static_cast<std::size_t>(cls)];
  move_bucket(node, cls, before, before + 1);
}

void Capacity::take(int node, int cls, int pos) {
  GpuMask& mask = free_[index(node, cls)];
  GpuMask bit = GpuMask{1} << pos;
  if (!(mask & bit)) return;
  int before = popcount(mask);
  mask &= ~bit;
  --free_total_[static_cast<std::size_t>(cls)];
  move_bucket(node, cls, before, before - 1);
}

void Capacity::take(const Placement& placement) {
  for (const auto& pn : placement.nodes) {
    for (GpuMask m = pn.gpus; m != 0; m &= m - 1) take(pn.node, placement.cls, __builtin_ctzll(m));
  }
}

bool Capacity::is_free(int node, int cls, int pos) const {
  return (free_[index(node, cls)] >> pos) & 1U;
}

int Capacity::nodes_with_at_least(int cls, int k) const {
  const auto& at_least = at_least_[static_cast<std::size_t>(cls)];
  if (k <= 0) return static_cast<int>(free_.size()) / std::max(1, num_classes_);
  if (k >= static_cast<int>(at_least.size())) return 0;
  return at_least[static_cast<std::size_t>(k)];
}

const std::set<int>& Capacity::nodes_with_exactly(int cls, int k) const {
  const auto& buckets = buckets_[static_cast<std::size_t>(cls)];
  if (k <= 0 || k >= static_cast<int>(buckets.size())) return kEmptySet;
  return buckets[static_cast<std::size_t>(k)];
}

GpuMask pick_gpus(GpuMask free, int count, const std::vector<GpuMask>& nvlink) {
  CORRAL_CHECK(popcount(free) >= count);
  if (popcount(free) == count) return free;
  GpuMask best = 0;
  int best_links = -1;
  for (GpuMask starts = free; starts != 0; starts &= starts - 1) {
    int start = __builtin_ctzll(starts);
    GpuMask chosen = GpuMask{1} << start;
    int links = 0;
    for (int n = 1; n < count; ++n) {
      int pick = -1;
      int pick_links = -1;
      for (GpuMask rest = free & ~chosen; rest != 0; rest &= rest - 1) {
        int pos = __builtin_ctzll(rest);
        int l = pos < static_cast<int>(nvlink.size()) ? popcount(nvlink[static_cast<std::size_t>(pos)] & chosen) : 0;
        if (l > pick_links) {
          pick = pos;
          pick_links = l;
        }
      }
      chosen |= GpuMask{1} << pick;
      links += pick_links;
    }
    if (links > best_links) {
      best = chosen;
      best_links = links;
    }
    // Without NVLink every start gives the same score: the lowest positions win at once.
    if (nvlink.empty()) break;
  }
  return best;
}

std::optional<Placement> place_in_class(const Capacity& cap, const std::vector<NodeLayout>& layouts, int cls,
                                        int nodes, int per_node) {
  if (nodes <= 0 || per_node <= 0) return std::nullopt;
  if (cap.nodes_with_at_least(cls, per_node) < nodes) return std::nullopt;
  Placement placement;
  placement.cls = cls;
  placement.nodes.reserve(static_cast<std::size_t>(nodes));
  for (int k = per_node; k <= cap.max_count(cls) && static_cast<int>(placement.nodes.size()) < nodes; ++k) {
    for (int node : cap.nodes_with_exactly(cls, k)) {
      GpuMask free = cap.free_mask(node, cls);
      placement.nodes.push_back({node, pick_gpus(free, per_node, layouts[static_cast<std::size_t>(node)].nvlink)});
      if (static_cast<int>(placement.nodes.size()) == nodes) break;
    }
  }
  CORRAL_CHECK(static_cast<int>(placement.nodes.size()) == nodes);
  return placement;
}

int leftover(const Capacity& cap, const Placement& placement) {
  int total = 0;
  for (const auto& pn : placement.nodes) total += cap.free_count(pn.node, placement.cls) - popcount(pn.gpus);
  return total;
}

}  // namespace corral::sched
