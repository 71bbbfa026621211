#include "cli/views.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <limits>

#include "common/protocol/json_reader.hpp"

namespace corral::cli {

namespace {

using protocol::Json;
using protocol::JsonReader;

// Generous bounds: the coordinator is trusted to be sane, these only keep a broken one
// from making us allocate without limit.
constexpr std::size_t kMaxAnswerBytes = 256 * 1024 * 1024;
constexpr std::size_t kMaxText = 64 * 1024;
constexpr std::size_t kMaxLogData = 64 * 1024 * 1024;
constexpr std::size_t kMaxItems = 1 << 20;
constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr std::int64_t kMinInt = std::numeric_limits<int>::min();

Error bad_answer(const std::string& what) {
  return Error(ErrorCode::Internal, "unexpected answer from the coordinator: " + what);
}

Result<Json> parse(std::string_view text) {
  auto j = protocol::parse_json(text, kMaxAnswerBytes);
  if (!j) return std::unexpected(bad_answer(j.error().message()));
  return j;
}

std::optional<int> opt_int(JsonReader& r, const char* key) {
  if (r.raw(key, false) == nullptr) return std::nullopt;
  return r.i32(key, kMinInt, static_cast<int>(kMaxInt));
}

std::optional<std::int64_t> opt_i64(JsonReader& r, const char* key) {
  if (r.raw(key, false) == nullptr) return std::nullopt;
  return r.i64(key, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
}

std::optional<double> opt_number(JsonReader& r, const char* key) {
  const Json* v = r.raw(key, false);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    r.fail(r.child_path(key), "must be a number");
    return std::nullopt;
  }
  return v->get<double>();
}

std::string text(JsonReader& r, const char* key) {
  return r.str(key, kMaxText, "");
}

RankInfo read_rank(const Json& j, const std::string& path, JsonReader& parent) {
  JsonReader r(j, path);
  RankInfo k;
  k.rank = r.i32("rank", 0, static_cast<int>(kMaxInt), 0);
  k.node = text(r, "node");
  k.local_rank = r.i32("local_rank", 0, static_cast<int>(kMaxInt), 0);
  k.gpus = r.int_list("gpus", kMaxItems, 0, static_cast<int>(kMaxInt), false);
  k.gpu_uuids = r.str_list("gpu_uuids", kMaxItems, kMaxText, false);
  k.pid = opt_i64(r, "pid");
  k.state = text(r, "state");
  k.exit_code = opt_int(r, "exit_code");
  k.signal = opt_int(r, "signal");
  k.gone = r.boolean("gone", false);
  k.joined_at = text(r, "joined_at");
  k.warnings = r.str_list("warnings", kMaxItems, kMaxText, false);
  parent.absorb(r);
  return k;
}

JobInfo read_job(const Json& j, const std::string& path, JsonReader& parent) {
  JsonReader r(j, path);
  JobInfo job;
  job.id = r.i64("id", 0, std::numeric_limits<std::int64_t>::max());
  job.name = text(r, "name");
  job.user = text(r, "user");
  job.state = text(r, "state");
  job.reason = text(r, "reason");
  job.detail = text(r, "detail");
  job.attempt = r.i32("attempt", 0, static_cast<int>(kMaxInt), 0);
  job.retries = r.i32("retries", 0, static_cast<int>(kMaxInt), 0);
  job.priority = r.i32("priority", kMinInt, static_cast<int>(kMaxInt), 0);
  job.nodes = r.i32("nodes", 0, static_cast<int>(kMaxInt), 0);
  job.gpus = r.i32("gpus", 0, static_cast<int>(kMaxInt), 0);
  job.time_limit_s = opt_number(r, "time_limit");
  job.submitted_at = text(r, "submitted_at");
  job.started_at = text(r, "started_at");
  job.ended_at = text(r, "ended_at");
  job.master_addr = text(r, "master_addr");
  job.master_port = opt_int(r, "master_port");
  job.node_list = r.str_list("node_list", kMaxItems, kMaxText, false);
  job.failed_rank = opt_int(r, "failed_rank");
  job.failed_node = text(r, "failed_node");
  job.exit_code = opt_int(r, "exit_code");
  if (r.raw("outcome", false) != nullptr) job.outcome = text(r, "outcome");
  if (const Json* fences = r.array("fences", kMaxItems, false)) {
    for (std::size_t i = 0; i < fences->size(); ++i) {
      JsonReader f((*fences)[i], r.item_path("fences", i));
      std::vector<int> gpus = f.int_list("gpus", kMaxItems, 0, static_cast<int>(kMaxInt), false);
      std::string gpu_text;
      for (int g : gpus) gpu_text += (gpu_text.empty() ? "" : ",") + std::to_string(g);
      auto port = opt_int(f, "port");
      std::string host = text(f, "host");
      job.fences.push_back(text(f, "node") + ": GPUs " + gpu_text +
                           (port ? " and port " + (host.empty() ? "" : host + ":") + std::to_string(*port) : "") +
                           " (attempt " + std::to_string(f.i32("attempt", 0, static_cast<int>(kMaxInt), 0)) + ")");
      r.absorb(f);
    }
  }
  if (const Json* rv = r.object("rendezvous", false)) {
    JsonReader v(*rv, r.child_path("rendezvous"));
    RendezvousInfo info;
    info.ranks = v.i32("ranks", 0, static_cast<int>(kMaxInt), 0);
    info.joined = v.i32("joined", 0, static_cast<int>(kMaxInt), 0);
    info.complete_after_ms = opt_i64(v, "complete_after_ms");
    info.timeout_s = opt_number(v, "timeout_s").value_or(0);
    if (const Json* waiting = v.array("waiting_for", kMaxItems, false)) {
      for (std::size_t i = 0; i < waiting->size(); ++i) {
        JsonReader w((*waiting)[i], v.item_path("waiting_for", i));
        int rank = w.i32("rank", 0, static_cast<int>(kMaxInt), 0);
        info.waiting_for.emplace_back(rank, text(w, "node"));
        v.absorb(w);
      }
    }
    r.absorb(v);
    job.rendezvous = info;
  }
  if (const Json* ranks = r.array("ranks", kMaxItems, false)) {
    for (std::size_t i = 0; i < ranks->size(); ++i)
      job.ranks.push_back(read_rank((*ranks)[i], r.item_path("ranks", i), r));
  }
  if (const Json* array = r.raw("array", false); array != nullptr && !array->is_null()) {
    JsonReader a(*array, r.child_path("array"));
    job.array_job = a.i64("job", 1, std::numeric_limits<std::int64_t>::max());
    job.array_index = a.i32("index", 0, static_cast<int>(kMaxInt), 0);
    job.array_max_running = a.i32("max_running", 0, static_cast<int>(kMaxInt), 0);
    r.absorb(a);
  }
  if (const Json* cancelled = r.array("array_cancelled", kMaxItems, false)) {
    for (const auto& c : *cancelled) {
      if (c.is_number_integer()) job.array_cancelled.push_back(c.get<std::int64_t>());
    }
  }
  if (const Json* deps = r.array("dependencies", kMaxItems, false)) {
    for (std::size_t i = 0; i < deps->size(); ++i) {
      JsonReader e((*deps)[i], r.item_path("dependencies", i));
      job.dependencies.emplace_back(text(e, "kind"), e.i64("job", 1, std::numeric_limits<std::int64_t>::max()));
      r.absorb(e);
    }
  }
  if (const Json* events = r.array("events", kMaxItems, false)) {
    for (std::size_t i = 0; i < events->size(); ++i) {
      JsonReader e((*events)[i], r.item_path("events", i));
      job.events.push_back({text(e, "at"), text(e, "text")});
      r.absorb(e);
    }
  }
  parent.absorb(r);
  return job;
}

NodeInfo read_node(const Json& j, const std::string& path, JsonReader& parent) {
  JsonReader r(j, path);
  NodeInfo n;
  n.name = text(r, "name");
  n.address = text(r, "address");
  n.state = text(r, "state");
  n.reason = text(r, "reason");
  n.simulated = r.boolean("simulated", false);
  n.connected = r.boolean("connected", false);
  n.last_seen = text(r, "last_seen");
  n.silent_since = text(r, "silent_since");
  n.lost_at = text(r, "lost_at");
  n.driver = text(r, "driver");
  n.cuda = text(r, "cuda");
  if (const Json* gpus = r.array("gpus", kMaxItems, false)) {
    for (std::size_t i = 0; i < gpus->size(); ++i) {
      JsonReader g((*gpus)[i], r.item_path("gpus", i));
      GpuInfo gpu;
      gpu.index = g.i32("index", 0, static_cast<int>(kMaxInt), 0);
      gpu.uuid = text(g, "uuid");
      gpu.name = text(g, "name");
      gpu.memory_mib = g.i64("memory_mib", 0, std::numeric_limits<std::int64_t>::max(), 0);
      gpu.driver = text(g, "driver");
      gpu.cuda = text(g, "cuda");
      gpu.job = opt_i64(g, "job");
      gpu.held = g.boolean("held", gpu.job.has_value());  // a coordinator from before "held": the job says
      n.gpus.push_back(std::move(gpu));
      r.absorb(g);
    }
  }
  if (const Json* classes = r.array("gpu_classes", kMaxItems, false)) {
    for (std::size_t i = 0; i < classes->size(); ++i) {
      JsonReader c((*classes)[i], r.item_path("gpu_classes", i));
      GpuClassInfo cls;
      cls.name = text(c, "name");
      cls.memory_mib = c.i64("memory_mib", 0, std::numeric_limits<std::int64_t>::max(), 0);
      cls.driver = text(c, "driver");
      cls.cuda = text(c, "cuda");
      cls.count = c.i32("count", 0, static_cast<int>(kMaxInt), 0);
      cls.used = c.i32("used", 0, static_cast<int>(kMaxInt), 0);
      n.gpu_classes.push_back(std::move(cls));
      r.absorb(c);
    }
  }
  parent.absorb(r);
  return n;
}

// The elements of a top-level JSON array, as text; nullopt when `text` is not one array.
// Brackets and commas inside strings are skipped; each element's own syntax is checked
// when it is parsed.
std::optional<std::vector<std::string_view>> array_elements(std::string_view text) {
  auto first = text.find_first_not_of(" \t\r\n");
  auto last = text.find_last_not_of(" \t\r\n");
  if (first == std::string_view::npos || text[first] != '[' || text[last] != ']') return std::nullopt;
  std::string_view inside = text.substr(first + 1, last - first - 1);
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  bool whole = protocol::scan_json_structure(inside, [&](std::size_t i, char c) {
    if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      return --depth >= 0;
    } else if (depth == 0) {
      out.push_back(inside.substr(start, i - start));
      start = i + 1;
    }
    return true;
  });
  if (!whole || depth != 0) return std::nullopt;
  std::string_view tail = inside.substr(start);
  if (tail.find_first_not_of(" \t\r\n") != std::string_view::npos) {
    out.push_back(tail);
  } else if (!out.empty()) {
    return std::nullopt;  // "[1,]"
  }
  return out;
}

// A list is parsed one element at a time: each element's document is read and freed
// before the next, so 10,000 jobs never stand in memory as one document (about ten times
// the text's size in nodes, each page of it faulted in) and the allocator reuses one
// element's memory for the next.
template <typename T, typename ReadOne>
Result<std::vector<T>> read_list(std::string_view json, ReadOne read_one) {
  if (json.size() > kMaxAnswerBytes) return std::unexpected(bad_answer("answer larger than the limit"));
  auto elements = array_elements(json);
  if (!elements) {
    auto j = parse(json);  // says what is wrong with it, or that it is not a list
    if (!j) return std::unexpected(j.error());
    return std::unexpected(bad_answer("expected a list"));
  }
  if (elements->size() > kMaxItems) return std::unexpected(bad_answer("more than " + std::to_string(kMaxItems) + " items"));
  const Json none;
  JsonReader top(none);
  std::vector<T> out;
  out.reserve(elements->size());
  for (std::size_t i = 0; i < elements->size(); ++i) {
    auto j = protocol::parse_json((*elements)[i], kMaxAnswerBytes);
    if (!j) return std::unexpected(bad_answer("[" + std::to_string(i) + "]: " + j.error().message()));
    out.push_back(read_one(*j, "[" + std::to_string(i) + "]", top));
    if (!top.ok()) return std::unexpected(bad_answer(top.error()));
  }
  return out;
}

template <typename T, typename ReadOne>
Result<T> read_one(std::string_view json, ReadOne read) {
  auto j = parse(json);
  if (!j) return std::unexpected(j.error());
  // A top-level reader only collects the nested reader's problem; it never reads fields.
  JsonReader top(*j);
  T out = read(*j, "", top);
  if (!top.ok()) return std::unexpected(bad_answer(top.error()));
  return out;
}


}  // namespace

std::vector<std::string> JobInfo::node_names() const {
  if (!node_list.empty()) return node_list;
  std::vector<std::pair<int, std::string>> by_rank;
  for (const auto& k : ranks) by_rank.emplace_back(k.rank, k.node);
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::string> names;
  for (const auto& [rank, node] : by_rank) {
    if (!node.empty() && std::find(names.begin(), names.end(), node) == names.end()) names.push_back(node);
  }
  return names;
}

Result<JobInfo> parse_job(std::string_view json) {
  return read_one<JobInfo>(json, read_job);
}

Result<std::vector<JobInfo>> parse_jobs(std::string_view json) {
  return read_list<JobInfo>(json, read_job);
}

Result<std::vector<NodeInfo>> parse_nodes(std::string_view json) {
  return read_list<NodeInfo>(json, read_node);
}

Result<NodeInfo> parse_node(std::string_view json) {
  return read_one<NodeInfo>(json, read_node);
}

Result<DryRunInfo> parse_dry_run(std::string_view json) {
  return read_one<DryRunInfo>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    DryRunInfo d;
    d.would_start = r.boolean("would_start", false);
    d.reason = text(r, "reason");
    d.detail = text(r, "detail");
    if (const Json* alloc = r.object("allocation", false)) {
      JsonReader a(*alloc, "allocation");
      d.master_addr = text(a, "master_addr");
      d.master_port = opt_int(a, "master_port");
      if (const Json* nodes = a.array("nodes", kMaxItems, false)) {
        for (std::size_t i = 0; i < nodes->size(); ++i) {
          JsonReader n((*nodes)[i], a.item_path("nodes", i));
          d.allocation.emplace_back(text(n, "node"),
                                    n.int_list("gpus", kMaxItems, 0, static_cast<int>(kMaxInt), false));
          a.absorb(n);
        }
      }
      r.absorb(a);
    }
    top.absorb(r);
    return d;
  });
}

Result<std::int64_t> parse_submitted_id(std::string_view json) {
  return read_one<std::int64_t>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    std::int64_t id = r.i64("id", 1, std::numeric_limits<std::int64_t>::max());
    top.absorb(r);
    return id;
  });
}

Result<std::vector<std::int64_t>> parse_submitted_ids(std::string_view json) {
  return read_one<std::vector<std::int64_t>>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    std::vector<std::int64_t> ids;
    if (const Json* list = r.array("ids", kMaxItems, false)) {
      for (const auto& v : *list) {
        if (v.is_number_integer()) ids.push_back(v.get<std::int64_t>());
      }
    }
    if (ids.empty()) ids.push_back(r.i64("id", 1, std::numeric_limits<std::int64_t>::max()));
    top.absorb(r);
    return ids;
  });
}

Result<LogChunk> parse_log_chunk(std::string_view json) {
  return read_one<LogChunk>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    LogChunk c;
    c.rank = r.i32("rank", 0, static_cast<int>(kMaxInt), 0);
    c.node = text(r, "node");
    c.offset = r.u64("offset", 0);
    c.data = r.str("data", kMaxLogData, "");
    c.size = r.u64("size", 0);
    c.finished = r.boolean("finished", false);
    c.cut = r.u64("cut", 0);
    c.lost = r.str("lost", 4096, "");
    top.absorb(r);
    return c;
  });
}

Result<std::vector<RankStackInfo>> parse_stacks(std::string_view json) {
  return read_one<std::vector<RankStackInfo>>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    std::vector<RankStackInfo> out;
    if (const Json* ranks = r.array("ranks", kMaxItems)) {
      for (std::size_t i = 0; i < ranks->size() && r.ok(); ++i) {
        JsonReader e((*ranks)[i], r.item_path("ranks", i));
        RankStackInfo k;
        k.rank = e.i32("rank", 0, static_cast<int>(kMaxInt));
        k.node = text(e, "node");
        k.report = e.str("report", kMaxLogData, "");
        r.absorb(e);
        out.push_back(std::move(k));
      }
    }
    top.absorb(r);
    return out;
  });
}

Result<UsageInfo> parse_usage(std::string_view json) {
  return read_one<UsageInfo>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    UsageInfo u;
    u.since = text(r, "since");
    u.until = text(r, "until");
    u.by = text(r, "by");
    u.total_gpu_hours = opt_number(r, "total_gpu_hours").value_or(0);
    u.own_only = r.boolean("own_only", false);
    if (const Json* rows = r.array("rows", kMaxItems)) {
      for (std::size_t i = 0; i < rows->size() && r.ok(); ++i) {
        JsonReader e((*rows)[i], r.item_path("rows", i));
        UsageInfo::Row row;
        row.key = u.by.empty() ? std::string() : e.str(u.by.c_str(), kMaxText, "");
        row.gpu_hours = opt_number(e, "gpu_hours").value_or(0);
        row.jobs = e.i64("jobs", 0, std::numeric_limits<std::int64_t>::max(), 0);
        r.absorb(e);
        u.rows.push_back(std::move(row));
      }
    }
    top.absorb(r);
    return u;
  });
}

Result<BulkCancelInfo> parse_bulk_cancel(std::string_view json) {
  return read_one<BulkCancelInfo>(json, [](const Json& j, const std::string&, JsonReader& top) {
    JsonReader r(j);
    BulkCancelInfo b;
    auto each = [&](const char* key, auto&& add) {
      if (const Json* list = r.array(key, kMaxItems)) {
        for (std::size_t i = 0; i < list->size() && r.ok(); ++i) {
          JsonReader e((*list)[i], r.item_path(key, i));
          add(e);
          r.absorb(e);
        }
      }
    };
    each("cancelled", [&](JsonReader& e) {
      std::int64_t id = e.i64("id", 1, std::numeric_limits<std::int64_t>::max());
      b.cancelled.emplace_back(id, text(e, "state"));
    });
    each("failed", [&](JsonReader& e) {
      // The id as sent: a number, or an ARRAY_INDEX that named no job.
      const Json* id = e.raw("id", false);
      b.failed.emplace_back(id != nullptr && id->is_number_integer() ? id->get<std::int64_t>() : 0, text(e, "error"));
    });
    top.absorb(r);
    return b;
  });
}

std::vector<std::string> parse_problems(std::string_view json) {
  auto j = protocol::parse_json(json, kMaxAnswerBytes);
  if (!j || !j->is_object()) return {};
  JsonReader r(*j);
  auto problems = r.str_list("problems", kMaxItems, kMaxText, false);
  return r.ok() ? problems : std::vector<std::string>{};
}

Result<std::string> pretty_json(std::string_view json) {
  if (json.size() > kMaxAnswerBytes) return std::unexpected(bad_answer("too large"));
  // ordered_json keeps the coordinator's key order, which is the documented one.
  bool too_deep = false;
  nlohmann::ordered_json::parser_callback_t cb = [&too_deep](int depth, nlohmann::ordered_json::parse_event_t,
                                                             nlohmann::ordered_json&) {
    if (depth > 32) too_deep = true;
    return !too_deep;
  };
  auto j = nlohmann::ordered_json::parse(json.begin(), json.end(), cb, false);
  if (too_deep) return std::unexpected(bad_answer("JSON nested deeper than 32 levels"));
  if (j.is_discarded()) return std::unexpected(bad_answer("malformed JSON"));
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}


}  // namespace corral::cli
