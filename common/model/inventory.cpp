#include "common/model/inventory.hpp"

namespace corral::model {

std::string GpuClass::to_string() const {
  return product + ", " + std::to_string(memory_mib) + " MiB, driver " + driver;
}

std::string_view to_string(NodeState state) {
  switch (state) {
    case NodeState::Up: return "up";
    case NodeState::Down: return "down";
    case NodeState::Drained: return "drained";
  }
  return "unknown";
}

std::optional<NodeState> parse_node_state(std::string_view text) {
  if (text == "up") return NodeState::Up;
  if (text == "down") return NodeState::Down;
  if (text == "drained") return NodeState::Drained;
  return std::nullopt;
}

}  // namespace corral::model
