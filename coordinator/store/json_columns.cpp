#include "coordinator/store/json_columns.hpp"

#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace corral::store {

namespace {

using nlohmann::json;

// nlohmann's accessors throw on a missing key or a wrong type; a column we wrote ourselves
// only fails that way if the file was edited or damaged, so one catch per column is enough.
template <typename T, typename Decode>
Result<T> decode(std::string_view text, std::string_view what, json::value_t expected, Decode&& fn) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return make_error(ErrorCode::InvalidArgument, std::string(what) + ": not valid JSON");
  }
  if (doc.type() != expected) {
    return make_error(ErrorCode::InvalidArgument, std::string(what) + ": unexpected JSON " + doc.type_name());
  }
  try {
    return fn(doc);
  } catch (const std::exception& e) {  // json::exception, or a value we do not know
    return make_error(ErrorCode::InvalidArgument, std::string(what) + ": " + e.what());
  }
}

// Names and ids come from agents through the protocol codec, which checks UTF-8; should
// an invalid sequence still get here, storing U+FFFD beats failing the state change.
std::string dump(const json& doc) {
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string allocation_to_json(const model::Allocation& allocation) {
  json nodes = json::array();
  for (const auto& n : allocation.nodes) nodes.push_back({{"node", n.node}, {"gpus", n.gpus}});
  json doc = {{"nodes", std::move(nodes)},
              {"master_addr", allocation.master_addr},
              {"master_port", allocation.master_port}};
  return dump(doc);
}

Result<model::Allocation> allocation_from_json(std::string_view text) {
  return decode<model::Allocation>(text, "allocation", json::value_t::object, [](const json& doc) {
    model::Allocation alloc;
    for (const auto& n : doc.at("nodes")) {
      alloc.nodes.push_back({n.at("node").get<std::string>(), n.at("gpus").get<std::vector<int>>()});
    }
    alloc.master_addr = doc.at("master_addr").get<std::string>();
    alloc.master_port = doc.at("master_port").get<int>();
    return alloc;
  });
}

std::string gpus_to_json(const std::vector<model::Gpu>& gpus) {
  json doc = json::array();
  for (const auto& g : gpus) {
    doc.push_back({{"index", g.index},
                   {"uuid", g.uuid},
                   {"pci_bus_id", g.pci_bus_id},
                   {"product", g.cls.product},
                   {"memory_mib", g.cls.memory_mib},
                   {"driver", g.cls.driver},
                   {"cuda_major", g.cuda.major},
                   {"cuda_minor", g.cuda.minor},
                   {"nvlink_peers", g.nvlink_peers}});
  }
  return dump(doc);
}

Result<std::vector<model::Gpu>> gpus_from_json(std::string_view text) {
  return decode<std::vector<model::Gpu>>(text, "gpus", json::value_t::array, [](const json& doc) {
    std::vector<model::Gpu> gpus;
    for (const auto& g : doc) {
      model::Gpu gpu;
      gpu.index = g.at("index").get<int>();
      gpu.uuid = g.at("uuid").get<std::string>();
      gpu.pci_bus_id = g.at("pci_bus_id").get<std::string>();
      gpu.cls.product = g.at("product").get<std::string>();
      gpu.cls.memory_mib = g.at("memory_mib").get<std::int64_t>();
      gpu.cls.driver = g.at("driver").get<std::string>();
      gpu.cuda.major = g.at("cuda_major").get<int>();
      gpu.cuda.minor = g.at("cuda_minor").get<int>();
      gpu.nvlink_peers = g.at("nvlink_peers").get<std::vector<int>>();
      gpus.push_back(std::move(gpu));
    }
    return gpus;
  });
}

std::string fences_to_json(const std::vector<Fence>& fences) {
  json doc = json::array();
  for (const auto& f : fences) {
    doc.push_back({{"attempt", f.attempt}, {"node", f.node}, {"gpus", f.gpus}, {"host", f.host}, {"port", f.port}});
  }
  return dump(doc);
}

Result<std::vector<Fence>> fences_from_json(std::string_view text) {
  return decode<std::vector<Fence>>(text, "fences", json::value_t::array, [](const json& doc) {
    std::vector<Fence> out;
    for (const auto& f : doc) {
      out.push_back({f.at("attempt").get<int>(), f.at("node").get<std::string>(), f.at("gpus").get<std::vector<int>>(),
                     f.at("host").get<std::string>(), f.at("port").get<int>()});
    }
    return out;
  });
}

std::string env_to_json(const model::EnvList& env) {
  json doc = json::array();
  for (const auto& [k, v] : env) doc.push_back(json::array({k, v}));
  return dump(doc);
}

Result<model::EnvList> env_from_json(std::string_view text) {
  return decode<model::EnvList>(text, "environment", json::value_t::array, [](const json& doc) {
    model::EnvList out;
    for (const auto& kv : doc) out.emplace_back(kv.at(0).get<std::string>(), kv.at(1).get<std::string>());
    return out;
  });
}

std::string ranks_to_json(const std::vector<RankRecord>& ranks) {
  auto optional_int = [](const std::optional<int>& v) { return v ? json(*v) : json(nullptr); };
  json doc = json::array();
  for (const auto& r : ranks) {
    doc.push_back({{"rank", r.rank},
                   {"node", r.node},
                   {"local_rank", r.local_rank},
                   {"gpus", r.gpus},
                   {"gpu_uuids", r.gpu_uuids},
                   {"pid", r.pid},
                   {"state", model::to_string(r.state)},
                   {"exit_code", optional_int(r.exit_code)},
                   {"signal", optional_int(r.signal)},
                   {"gone", r.gone},
                   {"joined_at", r.joined_at ? json(to_millis(*r.joined_at)) : json(nullptr)},
                   {"ended_at", r.ended_at ? json(to_millis(*r.ended_at)) : json(nullptr)},
                   {"warnings", r.warnings}});
  }
  return dump(doc);
}

Result<std::vector<RankRecord>> ranks_from_json(std::string_view text) {
  return decode<std::vector<RankRecord>>(text, "ranks", json::value_t::array, [](const json& doc) {
    // Every key is required, null included: a missing one means we did not write this.
    auto optional_int = [](const json& v) -> std::optional<int> {
      if (v.is_null()) return std::nullopt;
      return v.get<int>();
    };
    std::vector<RankRecord> ranks;
    for (const auto& r : doc) {
      RankRecord rank;
      rank.rank = r.at("rank").get<int>();
      rank.node = r.at("node").get<std::string>();
      rank.local_rank = r.at("local_rank").get<int>();
      rank.gpus = r.at("gpus").get<std::vector<int>>();
      rank.gpu_uuids = r.at("gpu_uuids").get<std::vector<std::string>>();
      rank.pid = r.at("pid").get<int>();
      auto state = r.at("state").get<std::string>();
      auto parsed = model::parse_rank_state(state);
      if (!parsed) throw std::invalid_argument("unknown rank state \"" + state + "\"");
      rank.state = *parsed;
      rank.exit_code = optional_int(r.at("exit_code"));
      rank.signal = optional_int(r.at("signal"));
      // Written since schema version 3; rows from before hold no ENDING job.
      rank.gone = r.contains("gone") && r.at("gone").get<bool>();
      // Written since rendezvous check-ins were recorded; absent in older rows.
      if (r.contains("joined_at") && !r.at("joined_at").is_null()) {
        rank.joined_at = from_millis(r.at("joined_at").get<std::int64_t>());
      }
      if (r.contains("ended_at") && !r.at("ended_at").is_null()) {
        rank.ended_at = from_millis(r.at("ended_at").get<std::int64_t>());
      }
      if (r.contains("warnings")) rank.warnings = r.at("warnings").get<std::vector<std::string>>();
      ranks.push_back(std::move(rank));
    }
    return ranks;
  });
}

}  // namespace corral::store
