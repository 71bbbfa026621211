#include "common/protocol/codec.hpp"

#include <algorithm>

#include "common/core/hex.hpp"

#include "common/core/overloaded.hpp"
#include "common/protocol/json_reader.hpp"
#include "common/protocol/model_json.hpp"

namespace corral::protocol {

namespace {

constexpr std::int64_t kMaxJobId = std::int64_t{1} << 53;
constexpr int kMaxAttempt = 1000;
constexpr int kMaxRank = 1 << 20;
// A year, in ms: longer than any deadline a spec allows (365d).
constexpr std::int64_t kMaxTimeoutMs = std::int64_t{366} * 24 * 3600 * 1000;
constexpr std::size_t kMaxEnv = 2048;  // a spec's env (256) and an exported environment (1024)
constexpr std::size_t kMaxValue = 64 * 1024;

Json running_to_json(const std::vector<RunningRank>& running) {
  Json a = Json::array();
  for (const auto& r : running) a.push_back(Json{{"job", r.job}, {"attempt", r.attempt}, {"rank", r.rank}, {"pid", r.pid}});
  return a;
}

Json env_to_json(const std::vector<std::pair<std::string, std::string>>& env) {
  Json a = Json::array();
  for (const auto& [k, v] : env) a.push_back(Json::array({k, v}));
  return a;
}

}  // namespace

std::string encode(const AgentMessage& message) {
  Json j = std::visit(
      Overloaded{
          [](const Hello& m) {
            Json gpus = Json::array();
            for (const auto& g : m.gpus) gpus.push_back(to_json(g));
            return Json{{"type", "hello"},
                        {"version", m.version},
                        {"node", m.node},
                        {"address", m.address},
                        {"ports", Json::array({m.ports.first, m.ports.last})},
                        {"simulated", m.simulated},
                        {"driver", m.driver},
                        {"cuda", m.cuda.to_string()},
                        {"gpus", gpus},
                        {"health_error", m.health_error},
                        {"running", running_to_json(m.running)},
                        {"cluster", m.cluster}};
          },
          [](const Heartbeat&) { return Json{{"type", "heartbeat"}}; },
          [](const Health& m) { return Json{{"type", "health"}, {"error", m.error}}; },
          [](const PrepareResult& m) {
            return Json{{"type", "prepare_result"}, {"job", m.job},         {"attempt", m.attempt},
                        {"ok", m.ok},               {"port_busy", m.port_busy}, {"nccl_id", m.nccl_id},
                        {"error", m.error},         {"master_port", m.master_port}};
          },
          [](const RankStarted& m) {
            return Json{{"type", "rank_started"}, {"job", m.job}, {"attempt", m.attempt}, {"rank", m.rank}, {"pid", m.pid}};
          },
          [](const RankExited& m) {
            return Json{{"type", "rank_exited"}, {"job", m.job},       {"attempt", m.attempt},
                        {"rank", m.rank},        {"exit_code", m.exit_code}, {"signal", m.signal},
                        {"reason", m.reason},    {"launch_failure", m.launch_failure},
                        {"ended_at", m.ended_at_ms}};
          },
          [](const LogData& m) {
            return Json{{"type", "log_data"}, {"request", m.request}, {"data", m.data},      {"offset", m.offset},
                        {"size", m.size},     {"finished", m.finished}, {"error", m.error},
                        {"cut", m.cut},       {"lost", m.lost}};
          },
          [](const Synced&) { return Json{{"type", "synced"}}; },
          [](const AttemptGone& m) { return Json{{"type", "attempt_gone"}, {"job", m.job}, {"attempt", m.attempt}}; },
          [](const RankJoined& m) {
            return Json{{"type", "rank_joined"}, {"job", m.job}, {"attempt", m.attempt}, {"rank", m.rank}};
          },
          [](const Inspection& m) {
            Json ranks = Json::array();
            for (const auto& k : m.ranks) {
              ranks.push_back(Json{{"rank", k.rank},   {"alive", k.alive}, {"pid", k.pid},
                                   {"command", k.command}, {"state", k.state}, {"wchan", k.wchan},
                                   {"cpu_ms", k.cpu_ms}, {"processes", k.processes}});
            }
            return Json{{"type", "inspection"}, {"job", m.job}, {"attempt", m.attempt}, {"ranks", ranks}};
          },
          [](const RankStall& m) {
            return Json{{"type", "rank_stall"}, {"job", m.job},         {"attempt", m.attempt}, {"rank", m.rank},
                        {"stalled", m.stalled}, {"idle_ms", m.idle_ms}, {"state", m.state}};
          },
          [](const RankWarning& m) {
            return Json{{"type", "rank_warning"}, {"job", m.job},   {"attempt", m.attempt},
                        {"rank", m.rank},         {"warning", m.warning}};
          },
          [](const Stacks& m) {
            Json ranks = Json::array();
            for (const auto& k : m.ranks) ranks.push_back(Json{{"rank", k.rank}, {"report", k.report}});
            return Json{{"type", "stacks"}, {"request", m.request}, {"ranks", ranks}};
          },
      },
      message);
  // Logs may hold any bytes: replace invalid UTF-8 rather than fail.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string encode(const CoordinatorMessage& message) {
  Json j = std::visit(
      Overloaded{
          [](const Welcome& m) {
            return Json{{"type", "welcome"},
                        {"version", m.version},
                        {"heartbeat_interval_ms", m.heartbeat_interval_ms},
                        {"kill_grace_ms", m.kill_grace_ms},
                        {"cluster", m.cluster}};
          },
          [](const Reconcile& m) {
            Json keep = Json::array();
            for (const auto& [job, attempt] : m.keep) keep.push_back(Json{{"job", job}, {"attempt", attempt}});
            return Json{{"type", "reconcile"}, {"keep", keep}};
          },
          [](const Prepare& m) {
            return Json{{"type", "prepare"},         {"job", m.job},           {"attempt", m.attempt},
                        {"master_addr", m.master_addr}, {"master_port", m.master_port}, {"nccl", m.nccl}};
          },
          [](const Launch& m) {
            Json ranks = Json::array();
            for (const auto& r : m.ranks) {
              ranks.push_back(
                  Json{{"rank", r.rank}, {"local_rank", r.local_rank}, {"node_rank", r.node_rank}, {"gpus", r.gpus}});
            }
            return Json{{"type", "launch"},
                        {"job", m.job},
                        {"attempt", m.attempt},
                        {"name", m.name},
                        {"user", m.user},
                        {"command", to_json(m.command)},
                        {"workdir", m.workdir},
                        {"env", env_to_json(m.env)},
                        {"nodes", m.nodes},
                        {"world_size", m.world_size},
                        {"local_world_size", m.local_world_size},
                        {"master_addr", m.master_addr},
                        {"master_port", m.master_port},
                        {"nccl_id", m.nccl_id},
                        {"gpu_visibility", m.gpus_per_rank ? "rank" : "node"},
                        {"max_restarts", m.max_restarts},
                        {"hang_timeout_ms", m.hang_timeout_ms},
                        {"ranks", ranks}};
          },
          [](const Kill& m) {
            return Json{{"type", "kill"}, {"job", m.job}, {"attempt", m.attempt}, {"grace_ms", m.grace_ms}};
          },
          [](const LogRequest& m) {
            return Json{{"type", "log_request"}, {"request", m.request}, {"job", m.job},          {"attempt", m.attempt},
                        {"rank", m.rank},          {"offset", m.offset},   {"max_bytes", m.max_bytes}};
          },
          [](const Ack& m) { return Json{{"type", "ack"}, {"received", m.received}}; },
          [](const Inspect& m) {
            return Json{{"type", "inspect"}, {"job", m.job}, {"attempt", m.attempt}, {"ranks", m.ranks}};
          },
          [](const StackRequest& m) {
            return Json{{"type", "stack_request"}, {"request", m.request}, {"job", m.job},
                        {"attempt", m.attempt},    {"ranks", m.ranks}};
          },
      },
      message);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// job, attempt and rank: what every report about one rank starts with.
template <class M>
void read_rank_key(JsonReader& r, M& m) {
  m.job = r.i64("job", 1, kMaxJobId);
  m.attempt = r.i32("attempt", 0, kMaxAttempt);
  m.rank = r.i32("rank", 0, kMaxRank);
}

// A list of objects under `key`, each read by `item`; problems named by index.
template <class T, class Item>
std::vector<T> read_list(JsonReader& r, const char* key, std::size_t max_items, Item item) {
  std::vector<T> out;
  if (const Json* a = r.array(key, max_items)) {
    for (std::size_t i = 0; i < a->size() && r.ok(); ++i) {
      JsonReader e((*a)[i], r.item_path(key, i));
      T t;
      item(e, t);
      r.absorb(e);
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::vector<RunningRank> running_from_json(JsonReader& r) {
  std::vector<RunningRank> out;
  const Json* a = r.array("running", 1 << 16);
  if (!a) return out;
  for (std::size_t i = 0; i < a->size() && r.ok(); ++i) {
    JsonReader e((*a)[i], r.item_path("running", i));
    RunningRank rr;
    rr.job = e.i64("job", 1, kMaxJobId);
    rr.attempt = e.i32("attempt", 0, kMaxAttempt);
    rr.rank = e.i32("rank", 0, kMaxRank);
    rr.pid = e.i32("pid", 1, 1 << 30);
    r.absorb(e);
    out.push_back(rr);
  }
  return out;
}

model::CudaVersion cuda_from(JsonReader& r, const char* key) {
  std::string text = r.str(key, 16);
  if (!r.ok()) return {};
  auto v = model::CudaVersion::parse(text);
  if (!v) r.fail(r.child_path(key), "must look like 12.4");
  return v.value_or(model::CudaVersion{});
}

Result<AgentMessage> decode_agent(const Json& j) {
  JsonReader r(j);
  std::string type = r.str("type", 32);
  if (!r.ok()) return std::unexpected(r.to_error());
  AgentMessage out;
  if (type == "hello") {
    Hello m;
    m.version = r.i32("version", 0, 1000);
    m.node = r.str("node", kMaxName);
    m.address = r.str("address", kMaxName);
    // MASTER_ADDR for the node's ranks and the key of its ports: an IP address or a host name.
    if (r.ok() && (m.address.empty() || m.address.size() > 253 ||
                   m.address.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-:") !=
                       std::string::npos)) {
      r.fail(r.child_path("address"), "must be an IP address or a host name");
    }
    std::vector<int> ports = r.int_list("ports", 2, 1, 65535);
    if (r.ok() && (ports.size() != 2 || ports[0] > ports[1])) r.fail("ports", "must be [first, last] with first <= last");
    if (r.ok()) m.ports = {ports[0], ports[1]};
    m.simulated = r.boolean("simulated");
    m.driver = r.str("driver", kMaxName, "");
    m.cuda = cuda_from(r, "cuda");
    m.gpus = gpus_from_json(r, "gpus");
    m.health_error = r.str("health_error", 4096, "");
    m.running = running_from_json(r);
    m.cluster = r.str("cluster", kMaxName, "");
    out = std::move(m);
  } else if (type == "heartbeat") {
    out = Heartbeat{};
  } else if (type == "synced") {
    out = Synced{};
  } else if (type == "rank_joined") {
    RankJoined m;
    read_rank_key(r, m);
    out = m;
  } else if (type == "inspection") {
    Inspection m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.ranks = read_list<RankProcess>(r, "ranks", 4096, [](JsonReader& e, RankProcess& k) {
      k.rank = e.i32("rank", 0, kMaxRank);
      k.alive = e.boolean("alive");
      k.pid = e.i32("pid", 0, 1 << 30);
      k.command = e.str("command", 64, "");
      k.state = e.str("state", 64, "");
      k.wchan = e.str("wchan", 128, "");
      k.cpu_ms = e.i64("cpu_ms", 0, std::int64_t{1} << 50);
      k.processes = e.i32("processes", 0, 1 << 22);
    });
    out = std::move(m);
  } else if (type == "rank_stall") {
    RankStall m;
    read_rank_key(r, m);
    m.stalled = r.boolean("stalled");
    m.idle_ms = r.i64("idle_ms", 0, kMaxTimeoutMs);
    m.state = r.str("state", 64, "");
    out = std::move(m);
  } else if (type == "rank_warning") {
    RankWarning m;
    read_rank_key(r, m);
    m.warning = r.str("warning", 1024);
    out = std::move(m);
  } else if (type == "stacks") {
    Stacks m;
    m.request = r.u64("request");
    m.ranks = read_list<RankStack>(r, "ranks", 4096, [](JsonReader& e, RankStack& k) {
      k.rank = e.i32("rank", 0, kMaxRank);
      k.report = e.str("report", kMaxStackReportBytes);
    });
    out = std::move(m);
  } else if (type == "attempt_gone") {
    AttemptGone m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    out = m;
  } else if (type == "health") {
    out = Health{r.str("error", 4096, "")};
  } else if (type == "prepare_result") {
    PrepareResult m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.ok = r.boolean("ok");
    m.port_busy = r.boolean("port_busy", false);
    m.master_port = r.i32("master_port", 1, 65535);
    m.nccl_id = r.str("nccl_id", 256, "");
    if (auto id = check_nccl_unique_id(m.nccl_id); r.ok() && !m.nccl_id.empty() && !id) {
      r.fail("nccl_id", id.error().message());
    }
    m.error = r.str("error", 4096, "");
    out = std::move(m);
  } else if (type == "rank_started") {
    RankStarted m;
    read_rank_key(r, m);
    m.pid = r.i32("pid", 1, 1 << 30);
    out = m;
  } else if (type == "rank_exited") {
    RankExited m;
    read_rank_key(r, m);
    m.exit_code = r.i32("exit_code", -1, 255);
    m.signal = r.i32("signal", 0, 128);
    m.reason = r.str("reason", 4096, "");
    m.launch_failure = r.boolean("launch_failure", false);
    m.ended_at_ms = r.i64("ended_at", 0, 32'503'680'000'000, 0);  // up to the year 3000
    out = std::move(m);
  } else if (type == "log_data") {
    LogData m;
    m.request = r.u64("request");
    m.data = r.str("data", kMaxMessageBytes);
    m.offset = r.u64("offset");
    m.size = r.u64("size");
    m.finished = r.boolean("finished");
    m.error = r.str("error", 4096, "");
    m.cut = r.u64("cut", 0);
    m.lost = r.str("lost", 4096, "");
    out = std::move(m);
  } else {
    return make_error(ErrorCode::InvalidArgument, "type: unknown message type " + type.substr(0, 32));
  }
  if (!r.ok()) return std::unexpected(r.to_error().with_context(type));
  return out;
}

Result<CoordinatorMessage> decode_coordinator(const Json& j) {
  JsonReader r(j);
  std::string type = r.str("type", 32);
  if (!r.ok()) return std::unexpected(r.to_error());
  CoordinatorMessage out;
  if (type == "welcome") {
    Welcome m;
    m.version = r.i32("version", 0, 1000);
    m.heartbeat_interval_ms = r.i64("heartbeat_interval_ms", 10, 3'600'000);
    m.kill_grace_ms = r.i64("kill_grace_ms", 0, 3'600'000);
    m.cluster = r.str("cluster", kMaxName, "");
    out = m;
  } else if (type == "reconcile") {
    Reconcile m;
    if (const Json* keep = r.array("keep", 1 << 16)) {
      for (std::size_t i = 0; i < keep->size() && r.ok(); ++i) {
        JsonReader e((*keep)[i], r.item_path("keep", i));
        auto job = e.i64("job", 1, kMaxJobId);
        auto attempt = e.i32("attempt", 0, kMaxAttempt);
        r.absorb(e);
        m.keep.emplace_back(job, attempt);
      }
    }
    out = std::move(m);
  } else if (type == "prepare") {
    Prepare m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.master_addr = r.str("master_addr", kMaxName);
    m.master_port = r.i32("master_port", 1, 65535);
    m.nccl = r.boolean("nccl");
    out = std::move(m);
  } else if (type == "launch") {
    Launch m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.name = r.str("name", kMaxName);
    m.user = r.str("user", kMaxName);
    m.command = command_from_json(r, "command");
    m.workdir = r.str("workdir", 4096, "");
    if (const Json* env = r.array("env", kMaxEnv)) {
      for (std::size_t i = 0; i < env->size() && r.ok(); ++i) {
        const Json& kv = (*env)[i];
        if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string() ||
            kv[0].get_ref<const std::string&>().size() > kMaxName || kv[1].get_ref<const std::string&>().size() > kMaxValue) {
          r.fail(r.item_path("env", i), "must be a [name, value] pair of strings");
          break;
        }
        m.env.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
      }
    }
    m.nodes = r.str_list("nodes", 4096, kMaxName);
    m.world_size = r.i32("world_size", 1, kMaxRank);
    m.local_world_size = r.i32("local_world_size", 1, 1024);
    m.master_addr = r.str("master_addr", kMaxName);
    m.master_port = r.i32("master_port", 1, 65535);
    m.nccl_id = r.str("nccl_id", 256, "");
    if (auto id = check_nccl_unique_id(m.nccl_id); r.ok() && !m.nccl_id.empty() && !id) {
      r.fail("nccl_id", id.error().message());
    }
    std::string visibility = r.str("gpu_visibility", 8, "node");
    if (visibility != "node" && visibility != "rank") r.fail(r.child_path("gpu_visibility"), "must be node or rank");
    m.gpus_per_rank = visibility == "rank";
    m.max_restarts = r.i32("max_restarts", 0, kMaxAttempt, 0);
    m.hang_timeout_ms = r.i64("hang_timeout_ms", 0, kMaxTimeoutMs, 0);
    if (const Json* ranks = r.array("ranks", 1024)) {
      for (std::size_t i = 0; i < ranks->size() && r.ok(); ++i) {
        JsonReader e((*ranks)[i], r.item_path("ranks", i));
        RankSpec rs;
        rs.rank = e.i32("rank", 0, kMaxRank);
        rs.local_rank = e.i32("local_rank", 0, 1024);
        rs.node_rank = e.i32("node_rank", 0, 4096);
        rs.gpus = e.int_list("gpus", kMaxGpus, 0, 1023);
        r.absorb(e);
        m.ranks.push_back(std::move(rs));
      }
    }
    out = std::move(m);
  } else if (type == "kill") {
    Kill m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.grace_ms = r.i64("grace_ms", 0, 3'600'000);
    out = m;
  } else if (type == "log_request") {
    LogRequest m;
    m.request = r.u64("request");
    read_rank_key(r, m);
    m.offset = r.u64("offset");
    m.max_bytes = r.u64("max_bytes");
    out = m;
  } else if (type == "ack") {
    out = Ack{r.u64("received")};
  } else if (type == "stack_request") {
    StackRequest m;
    m.request = r.u64("request");
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.ranks = r.int_list("ranks", 4096, 0, kMaxRank);
    out = std::move(m);
  } else if (type == "inspect") {
    Inspect m;
    m.job = r.i64("job", 1, kMaxJobId);
    m.attempt = r.i32("attempt", 0, kMaxAttempt);
    m.ranks = r.int_list("ranks", 4096, 0, kMaxRank);
    out = std::move(m);
  } else {
    return make_error(ErrorCode::InvalidArgument, "type: unknown message type " + type.substr(0, 32));
  }
  if (!r.ok()) return std::unexpected(r.to_error().with_context(type));
  return out;
}

}  // namespace

bool counts_as_report(std::string_view text) {
  // As is_report: every type but these. A message that is not even JSON was sent as one.
  static constexpr std::string_view kNotReports[] = {"hello", "heartbeat", "log_data", "synced", "inspection",
                                                     "stacks"};
  auto j = parse_json(text, kMaxMessageBytes);
  if (!j || !j->is_object() || !j->contains("type") || !(*j)["type"].is_string()) return true;
  const auto& type = (*j)["type"].get_ref<const std::string&>();
  return std::find(std::begin(kNotReports), std::end(kNotReports), type) == std::end(kNotReports);
}

bool is_encoded_heartbeat(std::string_view text) { return text == R"({"type":"heartbeat"})"; }

Result<AgentMessage> decode_agent_message(std::string_view text) {
  auto j = parse_json(text, kMaxMessageBytes);
  if (!j) return std::unexpected(j.error());
  return decode_agent(*j);
}

Result<CoordinatorMessage> decode_coordinator_message(std::string_view text) {
  auto j = parse_json(text, kMaxMessageBytes);
  if (!j) return std::unexpected(j.error());
  return decode_coordinator(*j);
}

std::string_view type_name(const AgentMessage& message) {
  static constexpr std::string_view kNames[] = {"hello", "heartbeat", "health", "prepare_result",
                                                "rank_started", "rank_exited", "log_data", "synced",
                                                "attempt_gone", "rank_joined", "inspection", "rank_stall",
                                                "stacks",       "rank_warning"};
  return kNames[message.index()];
}

std::string_view type_name(const CoordinatorMessage& message) {
  static constexpr std::string_view kNames[] = {"welcome", "reconcile", "prepare", "launch", "kill", "log_request", "ack",
                                                "inspect", "stack_request"};
  return kNames[message.index()];
}

}  // namespace corral::protocol
