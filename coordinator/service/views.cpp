#include "coordinator/service/views.hpp"

#include <algorithm>
#include <ctime>

#include "common/protocol/model_json.hpp"

namespace corral::service {


Json time_json(const std::optional<TimePoint>& t) { return t ? Json(format_time(*t)) : Json(nullptr); }

namespace {
template <typename T>
Json opt(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}
}  // namespace

Json job_json(const JobView& view, const std::vector<store::JobEvent>* events) {
  const auto& r = *view.record;
  Json ranks = Json::array();
  for (const auto& k : r.ranks) {
    ranks.push_back(Json{{"rank", k.rank},
                         {"node", k.node},
                         {"local_rank", k.local_rank},
                         {"gpus", k.gpus},
                         {"gpu_uuids", k.gpu_uuids},
                         {"pid", k.pid == 0 ? Json(nullptr) : Json(k.pid)},
                         {"state", std::string(model::to_string(k.state))},
                         {"exit_code", opt(k.exit_code)},
                         {"signal", opt(k.signal)},
                         {"gone", k.gone},
                         {"joined_at", time_json(k.joined_at)},
                         {"warnings", k.warnings}});
  }
  // The rendezvous: which ranks checked in, and when the last one did.
  Json rendezvous(nullptr);
  if (view.rendezvous_timeout && !r.ranks.empty()) {
    Json waiting_ranks = Json::array();
    std::optional<TimePoint> last;
    std::size_t joined = 0;
    for (const auto& k : r.ranks) {
      if (k.joined_at) {
        ++joined;
        last = last ? std::max(*last, *k.joined_at) : *k.joined_at;
      } else if (!model::rank_ended(k.state)) {
        waiting_ranks.push_back(Json{{"rank", k.rank}, {"node", k.node}});
      }
    }
    bool complete = joined == r.ranks.size();
    rendezvous = Json{{"ranks", r.ranks.size()},
                      {"joined", joined},
                      {"complete_after_ms", complete && r.started_at ? Json((*last - *r.started_at).count()) : Json(nullptr)},
                      {"waiting_for", waiting_ranks},
                      {"timeout_s", std::chrono::duration<double>(*view.rendezvous_timeout).count()}};
  }
  Json fences = Json::array();
  for (const auto& f : r.fences) {
    fences.push_back(Json{{"attempt", f.attempt}, {"node", f.node}, {"gpus", f.gpus},
                          {"host", f.port == 0 ? Json(nullptr) : Json(f.host)},
                          {"port", f.port == 0 ? Json(nullptr) : Json(f.port)}});
  }
  // ENDING: the ranks whose end is not confirmed yet, and whether each still runs.
  Json waiting = Json::array();
  if (r.state == model::JobState::Ending) {
    for (const auto& k : r.ranks) {
      bool fenced = std::any_of(r.fences.begin(), r.fences.end(),
                                [&](const auto& f) { return f.attempt == r.attempt && f.node == k.node; });
      if (k.gone || fenced) continue;
      waiting.push_back(Json{{"rank", k.rank}, {"node", k.node}, {"alive", !model::rank_ended(k.state)}});
    }
  }
  std::string reason = r.reason;
  std::string detail = r.detail;
  if (view.pending && r.state == model::JobState::Pending) {
    reason = std::string(sched::to_string(view.pending->code));
    detail = view.pending->detail;
  }
  Json j{{"id", r.id},
         {"name", r.name},
         {"user", r.user},
         {"state", std::string(model::to_string(r.state))},
         {"reason", reason},
         {"detail", detail},
         {"attempt", r.attempt},
         {"retries", view.retries},
         {"priority", view.priority},
         {"nodes", view.nodes},
         {"gpus", view.gpus},
         {"time_limit", view.time_limit ? Json(std::chrono::duration<double>(*view.time_limit).count()) : Json(nullptr)},
         {"submitted_at", format_time(r.submitted_at)},
         {"started_at", time_json(r.started_at)},
         {"ended_at", time_json(r.ended_at)},
         {"master_addr", r.allocation ? Json(r.allocation->master_addr) : Json(nullptr)},
         {"master_port", r.allocation ? Json(r.allocation->master_port) : Json(nullptr)},
         {"node_list", Json::array()},
         {"failed_rank", opt(r.failed_rank)},
         {"failed_node", r.failed_node},
         {"exit_code", opt(r.exit_code)},
         {"outcome", r.outcome ? Json(std::string(model::to_string(*r.outcome))) : Json(nullptr)},
         {"waiting_for", waiting},
         {"fences", fences},
         {"rendezvous", rendezvous},
         {"dependencies", Json::array()},
         {"ranks", ranks}};
  if (r.array) {
    j["array"] = Json{{"job", r.array->job}, {"index", r.array->index}, {"max_running", view.array_max_running}};
  } else {
    j["array"] = nullptr;
  }
  for (const auto& d : view.dependencies) {
    j["dependencies"].push_back(Json{{"kind", std::string(model::to_string(d.kind))}, {"job", d.job}});
  }
  if (r.allocation) {
    for (const auto& na : r.allocation->nodes) j["node_list"].push_back(na.node);
  }
  if (events != nullptr) {
    Json ev = Json::array();
    for (const auto& e : *events) ev.push_back(Json{{"at", format_time(e.at)}, {"text", e.text}});
    j["events"] = ev;
  }
  return j;
}

Json node_json(const NodeView& view, NodeGpus listed) {
  const auto& n = *view.node;
  auto holder = [&](std::size_t i) { return i < view.holders.size() ? view.holders[i] : std::nullopt; };
  Json gpus = Json::array();
  if (listed == NodeGpus::Each) {
    for (std::size_t i = 0; i < n.gpus.size(); ++i) {
      Json g = protocol::to_json(n.gpus[i]);
      g["held"] = holder(i).has_value();
      g["job"] = holder(i) && *holder(i) != 0 ? Json(*holder(i)) : Json(nullptr);
      gpus.push_back(std::move(g));
    }
  } else {
    // By class, in the order each class first appears on the node.
    std::vector<std::size_t> firsts;
    for (std::size_t i = 0; i < n.gpus.size(); ++i) {
      const auto& g = n.gpus[i];
      auto same = std::find_if(firsts.begin(), firsts.end(), [&](std::size_t f) {
        return n.gpus[f].cls == g.cls;
      });
      std::size_t at = static_cast<std::size_t>(same - firsts.begin());
      if (same == firsts.end()) {
        firsts.push_back(i);
        gpus.push_back(Json{{"name", g.cls.product},
                            {"memory_mib", g.cls.memory_mib},
                            {"driver", g.cls.driver},
                            {"cuda", g.cuda.to_string()},
                            {"count", 0},
                            {"used", 0}});
      }
      gpus[at]["count"] = gpus[at]["count"].get<int>() + 1;
      if (holder(i)) gpus[at]["used"] = gpus[at]["used"].get<int>() + 1;
    }
  }
  return Json{{"name", n.name},
              {"address", n.address},
              {"state", std::string(model::to_string(n.state))},
              {"reason", n.reason},
              {"simulated", n.simulated},
              {"connected", view.connected},
              {"last_seen", time_json(view.last_seen)},
              {"silent_since", time_json(view.silent_since)},
              {"lost_at", time_json(view.lost_at)},
              {"driver", view.driver},
              {"cuda", view.cuda},
              {"ports", Json::array({n.ports.first, n.ports.last})},
              {listed == NodeGpus::Each ? "gpus" : "gpu_classes", gpus}};
}

void NodeListing::append(const NodeView& view, NodeGpus gpus, std::string& out) {
  const model::Node& n = *view.node;
  auto it = entries_.find(n.name);
  if (it == entries_.end() || it->second.node != n || it->second.connected != view.connected ||
      it->second.silent_since != view.silent_since || it->second.lost_at != view.lost_at ||
      it->second.driver != view.driver || it->second.cuda != view.cuda ||
      it->second.holders != view.holders) {
    Entry entry{n, view.connected, view.silent_since, view.lost_at, view.driver, view.cuda, view.holders, {}};
    it = entries_.insert_or_assign(n.name, std::move(entry)).first;
  }
  auto& split = it->second.renderings[static_cast<std::size_t>(gpus)];
  if (split.head.empty()) {
    // Rendered with a marker where last_seen goes, split around it.
    static const std::string kMarker = "\x01last_seen\x01";
    Json j = node_json(view, gpus);
    j["last_seen"] = kMarker;
    std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    const std::string quoted = Json(kMarker).dump();
    const std::size_t at = text.find(quoted);
    split = {text.substr(0, at), text.substr(at + quoted.size())};
  }
  out += split.head;
  out += time_json(view.last_seen).dump();
  out += split.tail;
}

void NodeListing::keep_only(const std::vector<std::string>& names) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = std::binary_search(names.begin(), names.end(), it->first) ? std::next(it) : entries_.erase(it);
  }
}

}  // namespace corral::service
