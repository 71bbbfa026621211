#include "common/model/sim_inventory_yaml.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <exception>
#include <optional>
#include <set>
#include <span>

#include <yaml-cpp/yaml.h>

#include "common/core/strings.hpp"

namespace corral::model {

namespace {

constexpr std::array<std::string_view, 5> kTopFields = {"driver", "cuda", "gpus", "compute_apps",
                                                        "utilization"};
constexpr std::array<std::string_view, 3> kRequiredFields = {"driver", "cuda", "gpus"};
constexpr std::array<std::string_view, 4> kGroupFields = {"name", "memory_mb", "count", "nvlink"};
// Beyond any GPU made (the largest hold under 300 GB); it only catches a unit mistake.
constexpr std::int64_t kMaxMemoryMb = 1024 * 1024;
constexpr std::size_t kMaxNameBytes = 128;

struct Group {
  std::string name;
  std::int64_t memory_mb = 0;
  int count = 1;
  bool nvlink = false;
};

// Collects every problem of one file, each with where it is.
class SimReader {
 public:
  explicit SimReader(std::string_view file_name) : file_(file_name) {}

  std::optional<SimInventory> read(const YAML::Node& root);
  const std::vector<std::string>& problems() const { return problems_; }

  void add(const YAML::Mark& at, std::string_view field, const std::string& message) {
    std::string where = file_;
    if (at.line >= 0 && at.column >= 0) {
      where += ":" + std::to_string(at.line + 1) + ":" + std::to_string(at.column + 1);
    }
    problems_.push_back(where + ": " + (field.empty() ? "" : std::string(field) + ": ") + message);
  }

 private:
  // Calls visit(name, key, value) for each known field; reports unknown and repeated ones.
  template <typename Visit>
  void for_each_field(const YAML::Node& map, const std::string& prefix,
                      std::span<const std::string_view> known, std::set<std::string>& seen, Visit&& visit);

  std::optional<std::string> scalar(const YAML::Node& key, const YAML::Node& value, const std::string& field);
  std::optional<std::int64_t> integer(const YAML::Node& key, const YAML::Node& value,
                                      const std::string& field, std::int64_t lo, std::int64_t hi);
  std::optional<Group> read_group(const YAML::Node& item, const std::string& field);

  static YAML::Mark value_mark(const YAML::Node& key, const YAML::Node& value) {
    // An empty value is marked where the next token starts; point at its key instead.
    return value.IsNull() ? key.Mark() : value.Mark();
  }

  std::string file_;
  std::vector<std::string> problems_;
};

std::string describe(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsScalar()) return quote_for_message(node.Scalar());
  return "nothing";
}

template <typename Visit>
void SimReader::for_each_field(const YAML::Node& map, const std::string& prefix,
                               std::span<const std::string_view> known, std::set<std::string>& seen,
                               Visit&& visit) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    // Copies: the iterator hands out a temporary pair, and Nodes are cheap handles.
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    const std::string name = key.IsScalar() ? key.Scalar() : std::string("?");
    const std::string field = prefix + name;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string message = "unknown field";
      if (auto near = closest_match(name, known)) message += "; did you mean \"" + std::string(*near) + "\"?";
      add(key.Mark(), field, message);
      continue;
    }
    if (!seen.insert(name).second) {
      add(key.Mark(), field, "set twice");
      continue;
    }
    visit(name, key, value, field);
  }
}

std::optional<std::string> SimReader::scalar(const YAML::Node& key, const YAML::Node& value,
                                             const std::string& field) {
  if (!value.IsScalar()) {
    add(value_mark(key, value), field, "must be a single value, got " + describe(value));
    return std::nullopt;
  }
  return value.Scalar();
}

std::optional<std::int64_t> SimReader::integer(const YAML::Node& key, const YAML::Node& value,
                                               const std::string& field, std::int64_t lo, std::int64_t hi) {
  auto text = scalar(key, value, field);
  if (!text) return std::nullopt;
  auto parsed = parse_int<std::int64_t>(*text);
  std::int64_t number = parsed.value_or(0);
  if (!parsed || number < lo || number > hi) {
    add(value.Mark(), field,
        "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " +
            quote_for_message(*text));
    return std::nullopt;
  }
  return number;
}

bool valid_driver(std::string_view text) {
  // "550.54.15", "535.104.05", "560.28": two to four dot-separated numbers.
  if (text.empty() || text.size() > 32 || text.front() == '.' || text.back() == '.') return false;
  int dots = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '.') {
      if (text[i - 1] == '.') return false;
      ++dots;
    } else if (text[i] < '0' || text[i] > '9') {
      return false;
    }
  }
  return dots >= 1 && dots <= 3;
}

bool printable(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u != 0x7f;
  });
}

std::optional<Group> SimReader::read_group(const YAML::Node& item, const std::string& field) {
  if (!item.IsMap()) {
    add(item.Mark(), field,
        "must be a map like {name: ..., memory_mb: ..., count: ...}, got " + describe(item));
    return std::nullopt;
  }
  Group group;
  bool ok = true;
  std::set<std::string> seen;
  for_each_field(
      item, field + ".", kGroupFields, seen,
      [&](const std::string& name, const YAML::Node& key, const YAML::Node& value, const std::string& path) {
        if (name == "name") {
          auto text = scalar(key, value, path);
          if (text && (text->empty() || text->size() > kMaxNameBytes || !printable(*text))) {
            add(value_mark(key, value), path,
                "must be 1 to " + std::to_string(kMaxNameBytes) +
                    " printable characters, as nvidia-smi names the GPU");
            text.reset();
          }
          if (text) group.name = *text;
          ok = ok && text.has_value();
        } else if (name == "memory_mb") {
          auto mb = integer(key, value, path, 1, kMaxMemoryMb);
          if (mb) group.memory_mb = *mb;
          ok = ok && mb.has_value();
        } else if (name == "count") {
          auto count = integer(key, value, path, 1, kMaxSimGpus);
          if (count) group.count = static_cast<int>(*count);
          ok = ok && count.has_value();
        } else if (name == "nvlink") {
          auto text = scalar(key, value, path);
          if (text && (*text == "true" || *text == "yes")) {
            group.nvlink = true;
          } else if (text && (*text == "false" || *text == "no")) {
            group.nvlink = false;
          } else {
            if (text) add(value.Mark(), path, "must be true or false, got " + quote_for_message(*text));
            ok = false;
          }
        }
      });
  for (std::string_view required : {"name", "memory_mb"}) {
    if (!seen.contains(std::string(required))) {
      add(item.Mark(), field + "." + std::string(required), "required field is missing");
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return group;
}

std::optional<SimInventory> SimReader::read(const YAML::Node& root) {
  if (!root.IsMap()) {
    add(root.Mark(), "", "must be a map with driver, cuda and gpus, got " + describe(root));
    return std::nullopt;
  }
  SimInventory inventory;
  std::vector<Group> groups;
  YAML::Mark gpus_at;
  std::set<std::string> seen;
  for_each_field(
      root, "", kTopFields, seen,
      [&](const std::string& name, const YAML::Node& key, const YAML::Node& value, const std::string& field) {
        if (name == "driver") {
          auto text = scalar(key, value, field);
          if (text && !valid_driver(*text)) {
            add(value.Mark(), field,
                "must be a driver version like \"550.54.15\", got " + quote_for_message(*text));
          } else if (text) {
            inventory.driver = *text;
          }
        } else if (name == "cuda") {
          auto text = scalar(key, value, field);
          auto cuda = text ? CudaVersion::parse(*text) : std::nullopt;
          if (text && (!cuda || text->find('.') == std::string::npos)) {
            add(value.Mark(), field, "must be MAJOR.MINOR like \"12.4\", got " + quote_for_message(*text));
          } else if (cuda) {
            inventory.cuda = *cuda;
          }
        } else if (name == "compute_apps" || name == "utilization") {
          auto text = scalar(key, value, field);
          if (text && (text->empty() || text->size() > 4096)) {
            add(value.Mark(), field, "must be a file name, got " + quote_for_message(*text));
          } else if (text) {
            (name == "compute_apps" ? inventory.compute_apps : inventory.utilization) = *text;
          }
        } else if (name == "gpus") {
          gpus_at = value_mark(key, value);
          if (!value.IsSequence() || value.size() == 0) {
            add(gpus_at, field, "must be a non-empty list of GPU groups, got " + describe(value));
            return;
          }
          for (std::size_t i = 0; i < value.size(); ++i) {
            if (auto group = read_group(value[i], field + "[" + std::to_string(i) + "]"))
              groups.push_back(*group);
          }
        }
      });
  for (std::string_view required : kRequiredFields) {
    if (!seen.contains(std::string(required))) add(root.Mark(), required, "required field is missing");
  }
  int total = 0;
  for (const auto& group : groups) total += group.count;
  if (total > kMaxSimGpus) {
    add(gpus_at, "gpus",
        std::to_string(total) + " GPUs in all; a node has at most " + std::to_string(kMaxSimGpus));
  }
  if (!problems_.empty()) return std::nullopt;

  for (std::size_t g = 0; g < groups.size(); ++g) {
    const Group& group = groups[g];
    const int first = static_cast<int>(inventory.gpus.size());
    for (int i = 0; i < group.count; ++i) {
      Gpu gpu;
      gpu.index = first + i;
      std::array<char, 64> text{};
      std::snprintf(text.data(), text.size(), "GPU-sim-00000000-0000-0000-%04zu-%012d", g, gpu.index);
      gpu.uuid = text.data();
      std::snprintf(text.data(), text.size(), "00000000:%02X:00.0", static_cast<unsigned>(gpu.index + 1));
      gpu.pci_bus_id = text.data();
      gpu.cls = GpuClass{group.name, group.memory_mb, inventory.driver};
      gpu.cuda = inventory.cuda;
      if (group.nvlink) {
        for (int peer = first; peer < first + group.count; ++peer) {
          if (peer != gpu.index) gpu.nvlink_peers.push_back(peer);
        }
      }
      inventory.gpus.push_back(std::move(gpu));
    }
  }
  return inventory;
}

}  // namespace

Result<SimInventory> parse_sim_inventory(std::string_view yaml, std::string_view file_name) {
  const std::string file(file_name);
  if (yaml.size() > kMaxSimInventoryBytes) {
    return make_error(ErrorCode::InvalidArgument, file + ": file is " + std::to_string(yaml.size()) +
                                                      " bytes; the limit is " +
                                                      std::to_string(kMaxSimInventoryBytes));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    std::string where = file;
    if (e.mark.line >= 0 && e.mark.column >= 0) {
      where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    }
    return make_error(ErrorCode::InvalidArgument, where + ": " + e.msg);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::InvalidArgument, file + ": " + e.what());
  }
  if (!root.IsDefined() || root.IsNull()) {
    return make_error(ErrorCode::InvalidArgument,
                      file + ": file is empty; it must set driver, cuda and gpus");
  }
  SimReader reader(file_name);
  std::optional<SimInventory> inventory;
  try {
    inventory = reader.read(root);
  } catch (const std::exception& e) {
    // yaml-cpp throws on some malformed node accesses; this is input, not a bug.
    return make_error(ErrorCode::InvalidArgument, file + ": " + e.what());
  }
  if (!inventory) {
    std::string message;
    for (const auto& problem : reader.problems()) message += (message.empty() ? "" : "\n") + problem;
    return make_error(ErrorCode::InvalidArgument, message);
  }
  return *inventory;
}

}  // namespace corral::model
