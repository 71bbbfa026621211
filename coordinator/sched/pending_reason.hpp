#pragma once
// Why a job waits, in Slurm's words, with a sentence for people.

#include <optional>
#include <string>
#include <string_view>

namespace corral::sched {

enum class PendingCode {
  None,              // not waiting
  Resources,         // the GPUs it needs are busy
  Priority,          // jobs ahead of it in the queue come first
  NoHomogeneousSet,  // enough GPUs are free, but not of one class in the shape it asks
  NodeDown,          // it fits only if nodes that are down come back
  Drained,           // it fits only if drained nodes are resumed
  Dependency,        // a job it depends on (after_ok, ...) has not ended yet
  JobArrayTaskLimit, // its array already runs the most elements its "%N" allows
};

std::string_view to_string(PendingCode code);
std::optional<PendingCode> parse_pending_code(std::string_view text);

struct PendingReason {
  PendingCode code = PendingCode::None;
  std::string detail;  // "no homogeneous set of 8 GPUs: largest free set is 4 x ... on gpu-b"

  bool operator==(const PendingReason&) const = default;
};

}  // namespace corral::sched
