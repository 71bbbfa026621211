#pragma once
// What a node has: its GPUs and their class. Produced by the agent (nvidia-smi or a
// simulated file), consumed by the scheduler and shown by the CLI.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/cuda_version.hpp"

namespace corral::model {

// GPUs of one class are interchangeable for a job: the same product, memory and driver.
struct GpuClass {
  std::string product;       // "NVIDIA A100-SXM4-80GB"
  std::int64_t memory_mib = 0;
  std::string driver;        // "550.54.15"

  auto operator<=>(const GpuClass&) const = default;
  // "NVIDIA A100-SXM4-80GB, 81920 MiB, driver 550.54.15"
  std::string to_string() const;
};

struct Gpu {
  int index = 0;             // nvidia-smi's index on its node
  std::string uuid;
  std::string pci_bus_id;
  GpuClass cls;
  CudaVersion cuda;          // the highest CUDA version the driver supports
  std::vector<int> nvlink_peers;  // indices of GPUs joined to this one by NVLink

  bool operator==(const Gpu&) const = default;
};

struct PortRange {
  int first = 29500;
  int last = 29999;

  bool operator==(const PortRange&) const = default;
  bool contains(int port) const { return port >= first && port <= last; }
};

enum class NodeState { Up, Down, Drained };
std::string_view to_string(NodeState state);
std::optional<NodeState> parse_node_state(std::string_view text);

struct Node {
  std::string name;          // unique in the cluster; the CN of the agent's certificate
  std::string address;       // advertised host address; ports are reserved per address
  NodeState state = NodeState::Down;
  std::string reason;        // why down or drained
  bool simulated = false;    // inventory from a file, not nvidia-smi
  PortRange ports;
  std::vector<Gpu> gpus;

  bool operator==(const Node&) const = default;
};

}  // namespace corral::model
