#include "common/model/job_spec.hpp"

namespace corral::model {

std::string_view to_string(DependencyKind kind) {
  switch (kind) {
    case DependencyKind::AfterOk: return "after_ok";
    case DependencyKind::AfterAny: return "after_any";
    case DependencyKind::AfterNotOk: return "after_not_ok";
  }
  return "unknown";
}

std::string_view to_string(LaunchMode mode) {
  switch (mode) {
    case LaunchMode::Torch: return "torch";
    case LaunchMode::Nccl: return "nccl";
  }
  return "unknown";
}

std::string_view to_string(OnRendezvousTimeout action) {
  switch (action) {
    case OnRendezvousTimeout::Fail: return "fail";
    case OnRendezvousTimeout::Warn: return "warn";
  }
  return "unknown";
}

std::string_view to_string(GpuVisibility visibility) {
  switch (visibility) {
    case GpuVisibility::Node: return "node";
    case GpuVisibility::Rank: return "rank";
  }
  return "unknown";
}

int total_gpus(const JobSpec& spec) {
  if (spec.total_gpus) return *spec.total_gpus;
  return spec.nodes.value_or(1) * spec.gpus_per_node.value_or(0);
}

std::vector<std::pair<int, int>> candidate_shapes(const JobSpec& spec) {
  std::vector<std::pair<int, int>> shapes;
  if (spec.nodes && spec.gpus_per_node) {
    shapes.emplace_back(*spec.nodes, *spec.gpus_per_node);
    return shapes;
  }
  int total = total_gpus(spec);
  if (spec.nodes) {  // nodes and a total: the total divides evenly (validated)
    if (*spec.nodes > 0 && total % *spec.nodes == 0) shapes.emplace_back(*spec.nodes, total / *spec.nodes);
    return shapes;
  }
  for (int n = 1; n <= total; ++n) {
    if (total % n != 0) continue;
    int per_node = total / n;
    // With procs_per_node fixed, each node's GPU count must split evenly among them.
    if (spec.procs_per_node > 0 && per_node % spec.procs_per_node != 0) continue;
    shapes.emplace_back(n, per_node);
  }
  return shapes;
}

}  // namespace corral::model
