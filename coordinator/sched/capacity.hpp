#pragma once
// Capacity: the free GPUs of the cluster as placement sees them during one scheduling
// pass, grouped by class and by free count so that a gang of N nodes x G GPUs of one
// class is found in O(N + G) and ruled out in O(1). A plain value: the Scheduler builds
// one per pass (and copies for backfill reservations).

#include <cstdint>
#include <optional>
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
  // `max_per_node`: the most GPUs of one class any node has (at most kMaxGpusPerNode).
  Capacity(int num_nodes, int num_classes, int max_per_node);

  int num_classes() const { return num_classes_; }
  // Sets a node's free GPUs of a class in one step (used while building).
  void set_free(int node, int cls, GpuMask mask);
  void add_free(int node, int cls, int pos);
  void take(int node, int cls, int pos);
  // Takes every GPU of a placement.
  void take(const Placement& placement);
  bool is_free(int node, int cls, int pos) const { return (free_mask(node, cls) >> pos) & 1U; }
  GpuMask free_mask(int node, int cls) const { return free_[index(node, cls)]; }
  int free_count(int node, int cls) const { return popcount(free_mask(node, cls)); }
  // Nodes with at least k free GPUs of the class.
  int nodes_with_at_least(int cls, int k) const;
  int free_total(int cls) const { return free_total_[static_cast<std::size_t>(cls)]; }
  int max_count() const { return max_count_; }
  // Calls f(node) for the nodes with exactly k free GPUs of the class, by ascending node
  // slot, until f returns false.
  template <typename F>
  void for_each_with_exactly(int cls, int k, F&& f) const {
    const std::uint64_t* words = &buckets_[bucket(cls, k)];
    for (int w = 0; w < words_; ++w) {
      for (std::uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
        if (!f(w * 64 + __builtin_ctzll(bits))) return;
      }
    }
  }

 private:
  std::size_t index(int node, int cls) const {
    return static_cast<std::size_t>(node) * static_cast<std::size_t>(num_classes_) + static_cast<std::size_t>(cls);
  }
  std::size_t bucket(int cls, int k) const {
    return (static_cast<std::size_t>(cls) * static_cast<std::size_t>(max_count_ + 1) + static_cast<std::size_t>(k)) *
           static_cast<std::size_t>(words_);
  }
  void move_bucket(int node, int cls, int from, int to);

  int num_classes_ = 0;
  int max_count_ = 0;
  int words_ = 0;                          // 64-bit words per node bitset
  std::vector<GpuMask> free_;              // [node * num_classes + cls]
  // Node bitsets: [cls][free count][word]. Bitsets keep node order for best-fit ties
  // and make a copy (for a backfill reservation) a few kilobytes of memcpy.
  std::vector<std::uint64_t> buckets_;
  std::vector<int> at_least_;              // [cls * (max_count + 1) + k] nodes with >= k free
  std::vector<int> free_total_;            // [cls]
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
