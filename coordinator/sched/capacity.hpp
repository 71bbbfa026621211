#pragma once
// Capacity: the free GPUs of the cluster as placement sees them during one scheduling
// pass, grouped by class and by free count so that a gang of N nodes x G GPUs of one
// class is found in O(N + G) and ruled out in O(1). A plain value: the Scheduler builds
// one per pass (and copies for backfill reservations).

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace corral::sched {

using GpuMask = std::uint64_t;
inline constexpr int kMaxGpusPerNode = 64;

inline int popcount(GpuMask m) { return __builtin_popcountll(m); }

// The fixed layout of one node's GPUs: position p is node.gpus[p].
struct NodeLayout {
  std::vector<int> gpu_class;   // class id per position
  std::vector<GpuMask> nvlink;  // positions joined to position p by NVLink
};

// A gang found by placement: node slots (scheduler indices) and the GPU positions on each.
struct PlacedNode {
  int node = 0;
  GpuMask gpus = 0;
};
struct Placement {
  int cls = 0;
  std::vector<PlacedNode> nodes;
};

class Capacity {
 public:
  Capacity() = default;
  Capacity(int num_nodes, int num_classes);

  int num_classes() const { return num_classes_; }
  void add_free(int node, int cls, int pos);
  void take(int node, int cls, int pos);
  bool is_free(int node, int cls, int pos) const;
  GpuMask free_mask(int node, int cls) const { return free_[index(node, cls)]; }
  int free_count(int node, int cls) const { return popcount(free_mask(node, cls)); }
  // Nodes with at least k free GPUs of the class.
  int nodes_with_at_least(int cls, int k) const;
  int free_total(int cls) const { return free_total_[static_cast<std::size_t>(cls)]; }
  // Nodes with exactly k free GPUs of the class, by ascending node slot.
  const std::set<int>& nodes_with_exactly(int cls, int k) const;
  int max_count(int cls) const { return max_count_[static_cast<std::size_t>(cls)]; }

  // Takes every GPU of a placement.
  void take(const Placement& placement);

 private:
  std::size_t index(int node, int cls) const {
    return static_cast<std::size_t>(node) * static_cast<std::size_t>(num_classes_) + static_cast<std::size_t>(cls);
  }
  void move_bucket(int node, int cls, int from, int to);

  int num_classes_ = 0;
  std::vector<GpuMask> free_;                   // [node * num_classes + cls]
  std::vector<std::vector<std::set<int>>> buckets_;  // [cls][free count] -> node slots
  std::vector<std::vector<int>> at_least_;      // [cls][k] nodes with >= k free
  std::vector<int> free_total_;                 // [cls]
  std::vector<int> max_count_;                  // [cls] largest count a bucket may hold
};

// Picks `count` GPUs out of `free`, preferring sets joined by NVLink; lowest positions on
// ties. `free` has at least `count` bits.
GpuMask pick_gpus(GpuMask free, int count, const std::vector<GpuMask>& nvlink);

// A gang of `nodes` x `per_node` GPUs of class `cls`, best fit: nodes with the fewest
// free GPUs that still fit come first, so large holes stay open for large jobs.
std::optional<Placement> place_in_class(const Capacity& cap, const std::vector<NodeLayout>& layouts, int cls,
                                        int nodes, int per_node);

// Leftover free GPUs on the chosen nodes after the placement: smaller is a better fit.
int leftover(const Capacity& cap, const Placement& placement);

}  // namespace corral::sched
