// The status page (GET /, /status.js), the data it shows (GET /v1/status) and its live
// feed (GET /v1/status/events, server-sent events). docs/status-page.md.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "common/core/strings.hpp"
#include "common/core/version.hpp"
#include "common/model/job_array.hpp"
#include "coordinator/service/coordinator.hpp"
#include "coordinator/service/status_assets.hpp"
#include "coordinator/service/views.hpp"

namespace corral::service {

using model::JobState;

namespace {

// The page: its own script and inline styles, nothing from elsewhere.
const std::vector<std::pair<std::string, std::string>> kPageHeaders = {
    {"Cache-Control", "no-cache"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"X-Frame-Options", "DENY"},
    {"Content-Security-Policy",
     "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
     "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"}};

std::string job_ref(const store::JobRecord& r) {
  if (!r.array) return std::to_string(r.id);
  return std::to_string(r.array->job) + "_" + std::to_string(r.array->index);
}

Json status_error(int status, const std::string& message) { return Json{{"error", message}, {"status", status}}; }

}  // namespace

net::HttpResponse Coordinator::status_page(std::string_view path) {
  net::HttpResponse res;
  if (path == "/status.js") {
    res = {200, "text/javascript; charset=utf-8", std::string(status_script()), {}};
  } else {
    res = {200, "text/html; charset=utf-8", std::string(status_html()), {}};
  }
  res.headers = kPageHeaders;
  return res;
}

net::HttpResponse Coordinator::status(const net::HttpRequest& request, const Caller* caller) {
  constexpr std::size_t kMaxRows = 1000;
  auto number = [&](const char* key, std::size_t dflt, std::size_t lo, std::size_t hi) -> std::optional<std::size_t> {
    auto it = request.query.find(key);
    if (it == request.query.end()) return dflt;
    auto n = parse_int<std::size_t>(it->second);
    if (!n || *n < lo || *n > hi) return std::nullopt;
    return n;
  };
  auto offset = number("offset", 0, 0, std::numeric_limits<std::int32_t>::max());
  if (!offset) return {400, "application/json", status_error(400, "offset: must be a row number from 0").dump(), {}};
  auto limit = number("limit", 100, 1, kMaxRows);
  if (!limit) {
    return {400, "application/json",
            status_error(400, "limit: must be a number of rows from 1 to " + std::to_string(kMaxRows)).dump(), {}};
  }

  const Now now = clock_.read();
  const std::vector<std::pair<std::string, std::string>> no_store = {{"Cache-Control", "no-store"}};
  // Private jobs: the page names the caller's jobs only (an admin's, every one; an
  // anonymous page's, none); the counts in the strip and the GPUs held stay the cluster's.
  const bool everyone = !config_.private_data.jobs || (caller != nullptr && caller->admin);
  const std::string viewer = everyone ? "*" : caller != nullptr ? "u:" + caller->user : "-";
  auto shown = [&](const store::JobRecord& r) { return everyone || (caller != nullptr && r.user == caller->user); };
  if (!status_answer_.body.empty() && status_answer_.seq == status_seq_ && status_answer_.offset == *offset &&
      status_answer_.limit == *limit && status_answer_.viewer == viewer && now.mono - status_answer_.built < kStatusReuse) {
    return {200, "application/json", status_answer_.body, no_store};
  }
  const auto& sched = ledger_.scheduler();
  Json out;
  out["time"] = format_time(now.wall);
  out["version"] = std::string(version());
  out["seq"] = status_seq_;
  out["public"] = config_.public_status;
  // The page says so in a banner: what is shown may be ahead of what is on disk.
  out["store_error"] = committer_.failing() ? committer_.failing()->message() : "";
  out["private_jobs"] = config_.private_data.jobs;

  // The cluster strip: GPUs by class (product and memory) and state; nodes by state.
  struct ClassCount {
    int total = 0, allocated = 0, free = 0, drained = 0, down = 0;
  };
  std::map<std::pair<std::string, std::int64_t>, ClassCount> classes;
  int nodes_up = 0, nodes_drained = 0, nodes_down = 0;
  Json nodes = Json::array();
  std::set<model::JobId> holders;
  for (const auto* n : sched.nodes()) {
    const auto* link = ledger_.link(n->name);
    bool connected = link != nullptr && link->connected;
    std::string state(model::to_string(n->state));
    if (n->state == model::NodeState::Down) {
      ++nodes_down;
    } else if (n->state == model::NodeState::Drained) {
      ++nodes_drained;
    } else {
      ++nodes_up;
    }
    Json gpus = Json::array();
    for (const auto& g : n->gpus) {
      auto& c = classes[{g.cls.product, g.cls.memory_mib}];
      ++c.total;
      const auto holder = sched.gpu_holder(n->name, g.index);
      Json job = nullptr;  // stays null for a GPU held by a job this caller may not see
      if (holder) {
        ++c.allocated;
        const Job* j = ledger_.any_job(*holder);
        if (j != nullptr && shown(j->record)) holders.insert(*holder);
        if (everyone || (j != nullptr && shown(j->record))) job = *holder;
      } else if (n->state == model::NodeState::Down) {
        ++c.down;
      } else if (n->state == model::NodeState::Drained) {
        ++c.drained;
      } else {
        ++c.free;
      }
      gpus.push_back(Json{{"index", g.index}, {"held", holder.has_value()}, {"job", std::move(job)}});
    }
    nodes.push_back(Json{{"name", n->name},
                         {"state", state},
                         {"reason", n->reason},
                         {"simulated", n->simulated},
                         {"connected", connected},
                         {"last_seen", link != nullptr && link->connected ? time_json(now.date_of(link->last_seen)) : Json(nullptr)},
                         {"class", n->gpus.empty() ? Json(nullptr) : Json(n->gpus.front().cls.to_string())},
                         {"gpus", gpus}});
  }
  Json class_list = Json::array();
  for (const auto& [key, c] : classes) {
    class_list.push_back(Json{{"product", key.first}, {"memory_mib", key.second}, {"total", c.total},
                              {"allocated", c.allocated}, {"free", c.free}, {"drained", c.drained}, {"down", c.down}});
  }
  out["classes"] = class_list;
  out["nodes_by_state"] = Json{{"up", nodes_up}, {"drained", nodes_drained}, {"down", nodes_down}};
  out["nodes"] = nodes;

  // The queue: running jobs first, then pending ones, each by id; an array's pending
  // elements on one row, where its first one is.
  std::vector<const Job*> live;
  live.reserve(ledger_.live_jobs().size());
  std::map<std::string, int> by_state;
  for (const auto& [id, job] : ledger_.live_jobs()) {
    if (shown(job.record)) live.push_back(&job);
    ++by_state[std::string(model::to_string(job.record.state))];
  }
  std::sort(live.begin(), live.end(), [](const Job* a, const Job* b) {
    bool ap = a->record.state == JobState::Pending, bp = b->record.state == JobState::Pending;
    return ap != bp ? bp : a->record.id < b->record.id;
  });
  std::map<model::JobId, std::vector<int>> pending_elements;
  for (const Job* j : live) {
    if (j->record.array && j->record.state == JobState::Pending) pending_elements[j->record.array->job].push_back(j->record.array->index);
  }
  std::vector<const Job*> rows;
  rows.reserve(live.size());
  std::set<model::JobId> collapsed;
  for (const Job* j : live) {
    if (j->record.array && j->record.state == JobState::Pending && !collapsed.insert(j->record.array->job).second) continue;
    rows.push_back(j);
  }
  Json jobs_json = Json::object();
  for (const auto& [state, n] : by_state) jobs_json[state] = n;
  out["jobs_by_state"] = jobs_json;

  auto row_json = [&](const Job& j) {
    const auto& r = j.record;
    Json row{{"id", r.id},           {"ref", job_ref(r)},       {"elements", 1},
             {"name", r.name},       {"user", r.user},         {"state", std::string(model::to_string(r.state))},
             {"reason", r.reason},   {"detail", r.detail},     {"gpus", model::total_gpus(j.spec)},
             {"submitted_at", format_time(r.submitted_at)},    {"started_at", time_json(r.started_at)},
             {"time_limit", j.spec.time_limit ? Json(std::chrono::duration<double>(*j.spec.time_limit).count())
                                              : Json(nullptr)}};
    std::string node_list;
    if (r.allocation) {
      for (const auto& na : r.allocation->nodes) node_list += (node_list.empty() ? "" : ",") + na.node;
    }
    row["nodes"] = node_list;
    if (r.state == JobState::Pending) {
      if (const auto* sj = sched.job(r.id)) {
        row["reason"] = std::string(sched::to_string(sj->reason.code));
        row["detail"] = sj->reason.detail;
      }
      if (r.array) {
        const auto& indices = pending_elements.at(r.array->job);
        int max_running = j.spec.array ? j.spec.array->max_running : 0;
        row["ref"] = model::pending_array_ref(r.array->job, indices, max_running);
        row["elements"] = indices.size();
      }
    }
    return row;
  };
  Json page = Json::array();
  for (std::size_t i = *offset; i < rows.size() && i < *offset + *limit; ++i) page.push_back(row_json(*rows[i]));
  out["queue"] = Json{{"total", rows.size()}, {"offset", *offset}, {"limit", *limit}, {"rows", page}};

  // What the grid's cells name: the jobs holding GPUs.
  Json held = Json::object();
  for (model::JobId id : holders) {
    const Job* j = ledger_.any_job(id);
    if (j == nullptr) continue;
    const auto& r = j->record;
    held[std::to_string(id)] = Json{{"ref", job_ref(r)},
                                    {"name", r.name},
                                    {"user", r.user},
                                    {"state", std::string(model::to_string(r.state))},
                                    {"started_at", time_json(r.started_at)}};
  }
  out["holders"] = held;
  status_answer_ = {status_seq_, *offset, *limit, viewer, now.mono, out.dump(-1, ' ', false, Json::error_handler_t::replace)};
  return {200, "application/json", status_answer_.body, no_store};
}

std::string Coordinator::status_event() const {
  return "event: change\ndata: " + Json{{"seq", status_seq_}, {"ended", status_ended_}}.dump() + "\n\n";
}

void Coordinator::drop_closed_streams() {
  std::erase_if(status_streams_, [](const auto& s) { return !s.stream->open(); });
}

net::HttpResponse Coordinator::status_events(std::string token_hash) {
  net::HttpResponse res{200, "text/event-stream", "retry: 2000\n\n" + status_event(), {{"Cache-Control", "no-store"}}};
  res.stream = [this, token_hash = std::move(token_hash)](std::shared_ptr<net::EventStream> stream) {
    drop_closed_streams();
    status_streams_.push_back({std::move(stream), token_hash});
  };
  return res;
}

void Coordinator::close_streams_of_gone_tokens() {
  // Each distinct token once; a database that cannot answer closes nothing.
  std::map<std::string, bool> gone;
  for (auto& s : status_streams_) {
    if (s.token_hash.empty() || !s.stream->open()) continue;
    auto [it, first] = gone.try_emplace(s.token_hash, false);
    if (first) {
      users_.erase(s.token_hash);  // from the database, not a cache entry up to 5 s old
      auto caller = caller_for(s.token_hash);
      it->second = caller.has_value() && !caller->has_value();
    }
    if (it->second) s.stream->close();
  }
  drop_closed_streams();
}

void Coordinator::status_changed() {
  ++status_seq_;
  if (status_streams_.empty() || status_post_armed_) return;
  // Coalesced: at most one event per kStatusEventGap, however busy the cluster is.
  status_post_armed_ = true;
  if (!status_timer_) status_timer_ = std::make_unique<net::Timer>(loop_);
  status_timer_->start(kStatusEventGap, [this] {
    status_post_armed_ = false;
    broadcast_status(status_event());
  });
}

void Coordinator::broadcast_status(const std::string& text) {
  drop_closed_streams();
  for (const auto& s : status_streams_) s.stream->send(text);
}

}  // namespace corral::service
