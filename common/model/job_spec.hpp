#pragma once
// JobSpec: a job as a person wrote it, validated. Plain data; the YAML parser lives in
// job_spec_yaml.hpp and no YAML type leaks out of it.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/core/time.hpp"
#include "common/model/cuda_version.hpp"
#include "common/model/job_array.hpp"
#include "common/model/submission.hpp"

namespace corral::model {

enum class LaunchMode { Torch, Nccl };
std::string_view to_string(LaunchMode mode);

// What happens when not every rank has checked in by launch.rendezvous_timeout.
enum class OnRendezvousTimeout { Fail, Warn };
std::string_view to_string(OnRendezvousTimeout action);
inline constexpr Duration kDefaultRendezvousTimeout = std::chrono::minutes(5);

// Which GPUs a rank sees through CUDA_VISIBLE_DEVICES. Node (torchrun's contract): every
// local rank sees all of the job's GPUs on its node, in one order, and LOCAL_RANK indexes
// them. Rank: each rank sees only its own.
enum class GpuVisibility { Node, Rank };
std::string_view to_string(GpuVisibility visibility);

struct GpuConstraint {
  std::string model;                      // exact product name or glob; empty = any
  std::optional<std::int64_t> min_memory_mib;
  std::optional<CudaVersion> min_cuda;

  bool operator==(const GpuConstraint&) const = default;
};

struct Command {
  // shell == true: argv has one element, run by /bin/sh -c. Otherwise exec'd directly.
  bool shell = true;
  std::vector<std::string> argv;

  bool operator==(const Command&) const = default;
};

// after_ok / after_any / after_not_ok: jobs that must end (COMPLETED; in any state; in
// any state but COMPLETED) before this one may start.
enum class DependencyKind { AfterOk, AfterAny, AfterNotOk };
std::string_view to_string(DependencyKind kind);  // "after_ok", ...
inline constexpr std::size_t kMaxDependencies = 1000;  // each list

struct Dependency {
  DependencyKind kind = DependencyKind::AfterOk;
  std::int64_t job = 0;

  bool operator==(const Dependency&) const = default;
};

struct JobSpec {
  std::string name;
  Command command;
  std::string workdir;  // empty: where it was submitted from (Submission::dir), else the user's home
  std::vector<std::pair<std::string, std::string>> env;      // in file order, keys unique
  std::optional<ExportChoice> export_env;                    // `export:`; unset: the CLI's --export (ALL)

  // Resources. Either nodes x gpus_per_node (both set), or total_gpus with nodes unset
  // (the scheduler picks the fewest nodes that divide it evenly).
  std::optional<int> nodes;                                  // set: exactly this many nodes
  std::optional<int> gpus_per_node;
  std::optional<int> total_gpus;
  GpuConstraint gpu;

  LaunchMode mode = LaunchMode::Torch;
  GpuVisibility gpu_visibility = GpuVisibility::Node;
  // 0: one process per GPU. Otherwise processes per node; divides the GPUs per node.
  int procs_per_node = 0;
  // launch.rendezvous_timeout: how long after the start every rank has to check in
  // (rank 0 listening on MASTER_PORT, every other rank connected to it); 0: no deadline.
  Duration rendezvous_timeout = kDefaultRendezvousTimeout;
  OnRendezvousTimeout on_rendezvous_timeout = OnRendezvousTimeout::Fail;
  // launch.hang_timeout: a running job whose every rank used no CPU for this long gets an
  // event naming the ranks that stopped first; 0 (the default): not watched.
  Duration hang_timeout{0};

  std::optional<Duration> time_limit;
  int priority = 0;                                          // -1000..1000
  int retries = 0;                                           // 0..10
  std::vector<Dependency> dependencies;                      // in spec order: after_ok, after_any, after_not_ok
  std::optional<ArraySpec> array;                            // `array:`: one job per index

  bool operator==(const JobSpec&) const = default;
};

// The total number of GPUs the job asks for.
int total_gpus(const JobSpec& spec);

// The (nodes, gpus per node) shapes the job accepts, fewest nodes first.
std::vector<std::pair<int, int>> candidate_shapes(const JobSpec& spec);

}  // namespace corral::model
