#include "coordinator/store/json_columns.hpp"

#include "coordinator/store/store.hpp"

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
  } catch (const json::exception& e) {
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

std::string ranks_to_json(const std::vector<RankRecord>& ranks) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : ranks) {
    a.push_back(nlohmann::json{{"rank", r.rank},
                               {"node", r.node},
                               {"local_rank", r.local_rank},
                               {"gpus", r.gpus},
                               {"gpu_uuids", r.gpu_uuids},
                               {"pid", r.pid},
                               {"state", r.state},
                               {"exit_code", r.exit_code ? nlohmann::json(*r.exit_code) : nlohmann::json(nullptr)},
                               {"signal", r.signal ? nlohmann::json(*r.signal) : nlohmann::json(nullptr)}});
  }
  return a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<std::vector<RankRecord>> ranks_from_json(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return make_error(ErrorCode::InvalidArgument, "ranks column is not a JSON list");
  std::vector<RankRecord> out;
  try {
  for (const auto& e : j) {
    if (!e.is_object() || !e.contains("rank") || !e["rank"].is_number_integer() || !e.contains("node") ||
        !e["node"].is_string()) {
      return make_error(ErrorCode::InvalidArgument, "ranks column holds a malformed rank");
    }
    RankRecord r;
    r.rank = e["rank"].get<int>();
    r.node = e["node"].get<std::string>();
    r.local_rank = e.value("local_rank", 0);
    if (e.contains("gpus") && e["gpus"].is_array()) {
      for (const auto& g : e["gpus"]) {
        if (g.is_number_integer()) r.gpus.push_back(g.get<int>());
      }
    }
    if (e.contains("gpu_uuids") && e["gpu_uuids"].is_array()) {
      for (const auto& u : e["gpu_uuids"]) {
        if (u.is_string()) r.gpu_uuids.push_back(u.get<std::string>());
      }
    }
    r.pid = e.value("pid", 0);
    r.state = e.value("state", std::string("PENDING"));
    if (e.contains("exit_code") && e["exit_code"].is_number_integer()) r.exit_code = e["exit_code"].get<int>();
    if (e.contains("signal") && e["signal"].is_number_integer()) r.signal = e["signal"].get<int>();
    out.push_back(std::move(r));
  }
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::InvalidArgument, std::string("ranks column: ") + e.what());
  }
  return out;
}

}  // namespace corral::store
