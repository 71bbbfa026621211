#include "common/protocol/model_json.hpp"

namespace corral::protocol {

Json to_json(const model::Gpu& gpu) {
  return Json{{"index", gpu.index},
              {"uuid", gpu.uuid},
              {"pci_bus_id", gpu.pci_bus_id},
              {"name", gpu.cls.product},
              {"memory_mib", gpu.cls.memory_mib},
              {"driver", gpu.cls.driver},
              {"cuda", gpu.cuda.to_string()},
              {"nvlink_peers", gpu.nvlink_peers}};
}

Json to_json(const model::Allocation& alloc) {
  Json nodes = Json::array();
  for (const auto& n : alloc.nodes) nodes.push_back(Json{{"node", n.node}, {"gpus", n.gpus}});
  return Json{{"nodes", nodes}, {"master_addr", alloc.master_addr}, {"master_port", alloc.master_port}};
}

Json to_json(const model::Command& command) {
  if (command.shell && command.argv.size() == 1) return command.argv.front();
  return command.argv;
}

model::Gpu gpu_from_json(const Json& j, const std::string& path, JsonReader& parent) {
  JsonReader r(j, path);
  model::Gpu g;
  g.index = r.i32("index", 0, 1023);
  g.uuid = r.str("uuid", kMaxName, "");
  g.pci_bus_id = r.str("pci_bus_id", kMaxName, "");
  g.cls.product = r.str("name", kMaxName);
  g.cls.memory_mib = r.i64("memory_mib", 0, std::int64_t{1} << 40);
  g.cls.driver = r.str("driver", kMaxName);
  std::string cuda = r.str("cuda", 16);
  if (r.ok()) {
    auto v = model::CudaVersion::parse(cuda);
    if (!v) {
      r.fail(r.child_path("cuda"), "must look like 12.4");
    } else {
      g.cuda = *v;
    }
  }
  g.nvlink_peers = r.int_list("nvlink_peers", kMaxGpus, 0, 1023, false);
  parent.absorb(r);
  return g;
}

std::vector<model::Gpu> gpus_from_json(JsonReader& r, const char* key) {
  std::vector<model::Gpu> out;
  const Json* a = r.array(key, kMaxGpus);
  if (!a) return out;
  for (std::size_t i = 0; i < a->size() && r.ok(); ++i) out.push_back(gpu_from_json((*a)[i], r.item_path(key, i), r));
  return out;
}

model::Allocation allocation_from_json(const Json& j, const std::string& path, JsonReader& parent) {
  JsonReader r(j, path);
  model::Allocation a;
  a.master_addr = r.str("master_addr", kMaxName);
  a.master_port = r.i32("master_port", 0, 65535);
  if (const Json* nodes = r.array("nodes", 4096)) {
    for (std::size_t i = 0; i < nodes->size() && r.ok(); ++i) {
      JsonReader n((*nodes)[i], r.item_path("nodes", i));
      model::NodeAllocation na;
      na.node = n.str("node", kMaxName);
      na.gpus = n.int_list("gpus", kMaxGpus, 0, 1023);
      r.absorb(n);
      a.nodes.push_back(std::move(na));
    }
  }
  parent.absorb(r);
  return a;
}

model::Command command_from_json(JsonReader& r, const char* key) {
  model::Command c;
  const Json* v = r.raw(key, true);
  if (!v) return c;
  constexpr std::size_t kMaxCommand = 64 * 1024;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().size() > kMaxCommand || v->get_ref<const std::string&>().empty()) {
      r.fail(r.child_path(key), "must be 1 to " + std::to_string(kMaxCommand) + " bytes");
      return c;
    }
    c.shell = true;
    c.argv = {v->get<std::string>()};
    return c;
  }
  c.shell = false;
  c.argv = r.str_list(key, 4096, kMaxCommand);
  if (r.ok() && c.argv.empty()) r.fail(r.child_path(key), "must not be empty");
  return c;
}

}  // namespace corral::protocol
