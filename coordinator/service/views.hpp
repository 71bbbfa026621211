#pragma once
// JSON renderings of jobs and nodes for the API. Include
// only from .cpp files (brings nlohmann/json).

#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/core/time.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job_spec.hpp"
#include "coordinator/sched/pending_reason.hpp"
#include "coordinator/store/store.hpp"

namespace corral::service {

using Json = nlohmann::json;

Json time_json(const std::optional<TimePoint>& t);

struct JobView {
  const store::JobRecord* record = nullptr;
  int nodes = 0;
  int gpus = 0;
  int retries = 0;
  int priority = 0;
  std::optional<Duration> time_limit;
  // launch.rendezvous_timeout when the rendezvous is watched (torch mode), else unset.
  std::optional<Duration> rendezvous_timeout;
  std::optional<sched::PendingReason> pending;  // live reason while PENDING
  std::vector<model::Dependency> dependencies;  // from the spec
  int array_max_running = 0;                     // an array element: its array's "%N" (0: none)
};
Json job_json(const JobView& view, const std::vector<store::JobEvent>* events);

struct NodeView {
  const model::Node* node = nullptr;
  bool connected = false;
  std::optional<TimePoint> last_seen;
  // Its agent is away or silent: since when nothing was heard from it, and when the node
  // is lost if that goes on (node_lost_timeout). Unset while it is heard from.
  std::optional<TimePoint> silent_since;
  std::optional<TimePoint> lost_at;
  std::string driver;
  std::string cuda;
  // Per GPU, in node.gpus order: the job holding it; 0 for one held by a job the viewer
  // may not see (private_data: jobs).
  std::vector<std::optional<model::JobId>> holders;
};
// How a node's GPUs are listed: each one, or grouped by class ("gpu_classes": product,
// memory, driver, cuda, how many, how many a job holds) for a listing a line per node.
enum class NodeGpus { Each, Classes };
Json node_json(const NodeView& view, NodeGpus gpus = NodeGpus::Each);

// Renders node listings as node_json does, keeping each node's rendering between listings:
// a node is rendered again only when something it shows changes, but for its last_seen,
// which every heartbeat moves and which is written into the kept text. 2,000 nodes of 8
// GPUs are 3 MB of JSON; building them anew for every `corral nodes` cost 100 ms of the
// event loop.
class NodeListing {
 public:
  // Appends the node's JSON object to `out`, as node_json(view, gpus) renders it.
  void append(const NodeView& view, NodeGpus gpus, std::string& out);
  // Lets go of the renderings of nodes not in `names` (sorted).
  void keep_only(const std::vector<std::string>& names);
  std::size_t kept() const { return entries_.size(); }

 private:
  struct Entry {
    model::Node node;
    bool connected = false;
    std::optional<TimePoint> silent_since;
    std::optional<TimePoint> lost_at;
    std::string driver;
    std::string cuda;
    std::vector<std::optional<model::JobId>> holders;
    // By NodeGpus: the rendering up to last_seen's value and after it; empty until asked.
    struct Split {
      std::string head;
      std::string tail;
    };
    std::array<Split, 2> renderings;
  };
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace corral::service
