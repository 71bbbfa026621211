#include "coordinator/sched/pending_reason.hpp"

#include "common/core/enum_names.hpp"

namespace corral::sched {

namespace {
constexpr PendingCode kAll[] = {PendingCode::None,     PendingCode::Resources, PendingCode::Priority,
                                PendingCode::NoHomogeneousSet, PendingCode::NodeDown, PendingCode::Drained,
                                PendingCode::Dependency, PendingCode::JobArrayTaskLimit};
}

std::string_view to_string(PendingCode code) {
  switch (code) {
    case PendingCode::None: return "None";
    case PendingCode::Resources: return "Resources";
    case PendingCode::Priority: return "Priority";
    case PendingCode::NoHomogeneousSet: return "NoHomogeneousSet";
    case PendingCode::NodeDown: return "NodeDown";
    case PendingCode::Drained: return "Drained";
    case PendingCode::Dependency: return "Dependency";
    case PendingCode::JobArrayTaskLimit: return "JobArrayTaskLimit";
  }
  return "Unknown";
}

std::optional<PendingCode> parse_pending_code(std::string_view text) { return parse_enum_name(kAll, text); }

}  // namespace corral::sched
