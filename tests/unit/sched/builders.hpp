#pragma once
// Builders for scheduler tests: node("a").gpus(8, "NVIDIA H100 80GB HBM3").nvlink().

#include <string>
#include <utility>

#include "common/model/inventory.hpp"
#include "common/model/job_spec.hpp"

namespace corral::sched::testing {

inline Instant at_seconds(long s) { return Instant(std::chrono::seconds(s)); }

class NodeBuilder {
 public:
  explicit NodeBuilder(std::string name) {
    node_.name = std::move(name);
    node_.address = "10.0.0." + std::to_string(next_address_++);
    node_.state = model::NodeState::Up;
  }
  // Adds `count` GPUs of one product; memory and driver default to the product's usual.
  NodeBuilder& gpus(int count, std::string product, std::int64_t memory_mib = 81920, std::string driver = "550.54.15",
                    model::CudaVersion cuda = {12, 4}) {
    for (int i = 0; i < count; ++i) {
      model::Gpu g;
      g.index = static_cast<int>(node_.gpus.size());
      g.uuid = "GPU-" + node_.name + "-" + std::to_string(g.index);
      g.cls = {product, memory_mib, driver};
      g.cuda = cuda;
      node_.gpus.push_back(std::move(g));
    }
    return *this;
  }
  // Joins GPUs [first, first + count) all-to-all by NVLink.
  NodeBuilder& nvlink(int first, int count) {
    for (int i = first; i < first + count; ++i) {
      for (int j = first; j < first + count; ++j) {
        if (i != j) node_.gpus[static_cast<std::size_t>(i)].nvlink_peers.push_back(j);
      }
    }
    return *this;
  }
  NodeBuilder& address(std::string a) {
    node_.address = std::move(a);
    return *this;
  }
  NodeBuilder& ports(int first, int last) {
    node_.ports = {first, last};
    return *this;
  }
  NodeBuilder& state(model::NodeState s) {
    node_.state = s;
    return *this;
  }
  operator model::Node() const { return node_; }  // NOLINT(google-explicit-constructor)
  model::Node build() const { return node_; }

 private:
  static inline int next_address_ = 1;
  model::Node node_;
};

inline NodeBuilder node(std::string name) { return NodeBuilder(std::move(name)); }

class JobBuilder {
 public:
  JobBuilder() {
    spec_.name = "job";
    spec_.command.argv = {"true"};
    spec_.nodes = 1;
    spec_.gpus_per_node = 1;
  }
  JobBuilder& nodes(int n, int per_node) {
    spec_.nodes = n;
    spec_.gpus_per_node = per_node;
    spec_.total_gpus.reset();
    return *this;
  }
  JobBuilder& total(int gpus) {
    spec_.nodes.reset();
    spec_.gpus_per_node.reset();
    spec_.total_gpus = gpus;
    return *this;
  }
  JobBuilder& model(std::string glob) {
    spec_.gpu.model = std::move(glob);
    return *this;
  }
  JobBuilder& min_memory_mib(std::int64_t m) {
    spec_.gpu.min_memory_mib = m;
    return *this;
  }
  JobBuilder& min_cuda(model::CudaVersion v) {
    spec_.gpu.min_cuda = v;
    return *this;
  }
  JobBuilder& limit(Duration d) {
    spec_.time_limit = d;
    return *this;
  }
  JobBuilder& priority(int p) {
    spec_.priority = p;
    return *this;
  }
  JobBuilder& retries(int r) {
    spec_.retries = r;
    return *this;
  }
  JobBuilder& procs(int p) {
    spec_.procs_per_node = p;
    return *this;
  }
  operator model::JobSpec() const { return spec_; }  // NOLINT(google-explicit-constructor)
  model::JobSpec build() const { return spec_; }

 private:
  model::JobSpec spec_;
};

inline JobBuilder job() { return JobBuilder(); }

}  // namespace corral::sched::testing
