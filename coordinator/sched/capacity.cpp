#include "coordinator/sched/capacity.hpp"

#include <algorithm>

#include "common/core/check.hpp"

namespace corral::sched {

Capacity::Capacity(int num_nodes, int num_classes, int max_per_node)
    : num_classes_(num_classes),
      max_count_(std::min(max_per_node, kMaxGpusPerNode)),
      words_((num_nodes + 63) / 64),
      free_(static_cast<std::size_t>(num_nodes) * static_cast<std::size_t>(num_classes), 0),
      buckets_(static_cast<std::size_t>(num_classes) * static_cast<std::size_t>(max_count_ + 1) *
                   static_cast<std::size_t>(words_),
               0),
      at_least_(static_cast<std::size_t>(num_classes) * static_cast<std::size_t>(max_count_ + 1), 0),
      free_total_(static_cast<std::size_t>(num_classes), 0) {}

void Capacity::move_bucket(int node, int cls, int from, int to) {
  std::uint64_t bit = std::uint64_t{1} << (node % 64);
  std::size_t word = static_cast<std::size_t>(node / 64);
  if (from > 0) buckets_[bucket(cls, from) + word] &= ~bit;
  if (to > 0) buckets_[bucket(cls, to) + word] |= bit;
  // at_least[k] counts nodes with count >= k; only the counts between from and to move.
  int* at_least = &at_least_[static_cast<std::size_t>(cls) * static_cast<std::size_t>(max_count_ + 1)];
  if (to > from) {
    for (int k = from + 1; k <= to; ++k) ++at_least[k];
  } else {
    for (int k = to + 1; k <= from; ++k) --at_least[k];
  }
}

void Capacity::set_free(int node, int cls, GpuMask mask) {
  GpuMask& cur = free_[index(node, cls)];
  int before = popcount(cur);
  int after = popcount(mask);
  CORRAL_CHECK(after <= max_count_);
  cur = mask;
  free_total_[static_cast<std::size_t>(cls)] += after - before;
  if (before != after) move_bucket(node, cls, before, after);
}

void Capacity::add_free(int node, int cls, int pos) {
  GpuMask mask = free_mask(node, cls);
  GpuMask bit = GpuMask{1} << pos;
  if (!(mask & bit)) set_free(node, cls, mask | bit);
}

void Capacity::take(int node, int cls, int pos) {
  GpuMask mask = free_mask(node, cls);
  GpuMask bit = GpuMask{1} << pos;
  if (mask & bit) set_free(node, cls, mask & ~bit);
}

void Capacity::take(const Placement& placement) {
  for (const auto& pn : placement.nodes) {
    set_free(pn.node, placement.cls, free_mask(pn.node, placement.cls) & ~pn.gpus);
  }
}

int Capacity::nodes_with_at_least(int cls, int k) const {
  if (k <= 0) return static_cast<int>(free_.size()) / std::max(1, num_classes_);
  if (k > max_count_) return 0;
  return at_least_[static_cast<std::size_t>(cls) * static_cast<std::size_t>(max_count_ + 1) + static_cast<std::size_t>(k)];
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
  for (int k = per_node; k <= cap.max_count() && static_cast<int>(placement.nodes.size()) < nodes; ++k) {
    cap.for_each_with_exactly(cls, k, [&](int node) {
      GpuMask free = cap.free_mask(node, cls);
      placement.nodes.push_back({node, pick_gpus(free, per_node, layouts[static_cast<std::size_t>(node)].nvlink)});
      return static_cast<int>(placement.nodes.size()) < nodes;
    });
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
