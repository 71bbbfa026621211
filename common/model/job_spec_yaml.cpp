#include "common/model/job_spec_yaml.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <sstream>
#include <span>
#include <tuple>
#include <utility>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "common/core/strings.hpp"
#include "common/core/enum_names.hpp"
#include "common/model/job_spec_text.hpp"

namespace corral::model {

namespace {

using spec_text::join_names;
using spec_text::join_path;
using spec_text::parse_decimal;
using spec_text::parse_integer;
using spec_text::path_component;
using spec_text::reserved_env_problem;
using spec_text::valid_env_name;
using spec_text::valid_job_name;

constexpr std::array<std::string_view, 14> kTopFields = {
    "name",       "command",  "workdir", "env",      "export",    "resources",    "launch",
    "time_limit", "priority", "retries", "after_ok", "after_any", "after_not_ok", "array"};
constexpr std::array<std::string_view, 4> kResourceFields = {"nodes", "gpus_per_node", "gpus", "gpu"};
constexpr std::array<std::string_view, 3> kGpuFields = {"model", "min_memory_gb", "min_cuda"};
constexpr std::array<std::string_view, 6> kLaunchFields = {"mode",
                                                           "procs_per_node",
                                                           "gpu_visibility",
                                                           "rendezvous_timeout",
                                                           "on_rendezvous_timeout",
                                                           "hang_timeout"};
// A sanity bound: no GPU comes near it, and it keeps gb * 1024 far from overflowing.
constexpr double kMaxMemoryGb = 16384;

struct Position {
  int line = 0;
  int column = 0;
};

Position position_of(const YAML::Mark& mark) {
  if (mark.line < 0 || mark.column < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

bool before(Position a, Position b) {
  return std::tie(a.line, a.column) < std::tie(b.line, b.column);
}

// How a value looks in "got ..." messages.
std::string describe(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsScalar()) return quote_for_message(node.Scalar());
  return "an empty value";
}

// One key: value pair of a YAML map, with where to point for each half.
struct Entry {
  YAML::Node key;
  YAML::Node value;
  std::string path;
  Position key_at;
  // The value's own position, except for an empty value (yaml-cpp marks the next line)
  // and an alias (marked where its anchor is): those point at the key.
  Position value_at;
};

using Fields = std::map<std::string_view, Entry, std::less<>>;

// The resources as written, kept until the launch section is known too.
struct ResourceFields {
  std::optional<Entry> nodes_entry;
  std::optional<Entry> gpus_per_node_entry;
  std::optional<Entry> gpus_entry;
  std::optional<int> nodes;  // each set only when the value itself is valid
  std::optional<int> gpus_per_node;
  std::optional<int> gpus;
};

struct LaunchFields {
  std::optional<Entry> procs_entry;
  std::optional<int> procs_per_node;  // 0: one per GPU
};

// Walks one document: first a bounded structural pass, then the schema. Lives for one
// parse on the caller's thread; every problem goes into the caller's vector.
class SpecReader {
 public:
  SpecReader(const SpecLimits& limits, std::vector<SpecProblem>& problems)
      : limits_(limits), problems_(problems) {}

  // Depth and node count, aliases expanded. Fails fast: a billion-laughs document is
  // abandoned after max_nodes_in_document visits, whatever it would expand to.
  bool within_bounds(const YAML::Node& root) {
    std::size_t count = 0;
    return walk_bounds(root, 1, "", count);
  }

  std::optional<JobSpec> read(const YAML::Node& root);

 private:
  void add(Position at, std::string path, std::string message) {
    problems_.push_back(SpecProblem{at.line, at.column, std::move(path), std::move(message)});
  }

  bool walk_bounds(const YAML::Node& node, int depth, const std::string& path, std::size_t& count);

  template <typename Visit>
  void for_each_entry(const YAML::Node& map, const std::string& path, Visit&& visit);
  Fields read_fields(const YAML::Node& map, const std::string& path, std::span<const std::string_view> known);
  void require(const Fields& fields, std::string_view name, const std::string& path, Position map_at);
  bool expect_map(const Entry& entry, std::string_view expectation);

  std::optional<std::string> read_scalar(const Entry& entry, std::string_view expectation);
  std::optional<std::string> read_string(const Entry& entry, std::string_view expectation,
                                         std::size_t max_bytes);
  bool check_text(Position at, const std::string& path, std::string_view text, std::size_t max_bytes);
  std::optional<int> read_positive(const Entry& entry, std::int64_t max);
  // One of `all` by its to_string() name; else a problem saying `expectation`.
  template <typename E, std::size_t N>
  std::optional<E> read_choice(const Entry& entry, const E (&all)[N], std::string_view expectation) {
    auto text = read_scalar(entry, expectation);
    if (!text) return std::nullopt;
    auto value = parse_enum_name(all, *text);
    if (!value) add(entry.value_at, entry.path, std::string(expectation) + ", got " + quote_for_message(*text));
    return value;
  }
  std::optional<int> read_in_range(const Entry& entry, std::int64_t lo, std::int64_t hi);

  void read_name(const Entry& entry, JobSpec& spec);
  void read_command(const Entry& entry, JobSpec& spec);
  void read_workdir(const Entry& entry, JobSpec& spec);
  void read_env(const Entry& entry, JobSpec& spec);
  void read_export(const Entry& entry, JobSpec& spec);
  ResourceFields read_resources(const Entry& entry, JobSpec& spec);
  void read_gpu(const Entry& entry, GpuConstraint& gpu);
  LaunchFields read_launch(const Entry& entry, JobSpec& spec);
  void read_time_limit(const Entry& entry, JobSpec& spec);
  void read_dependencies(const Entry& entry, DependencyKind kind, JobSpec& spec);
  void check_shape(const Entry& resources, const ResourceFields& res, const LaunchFields& launch,
                   JobSpec& spec);

  const SpecLimits& limits_;
  std::vector<SpecProblem>& problems_;
  Position top_at_{};      // while walking the bounds: the top-level field being walked
  std::string top_path_;
};

bool SpecReader::walk_bounds(const YAML::Node& node, int depth, const std::string& path, std::size_t& count) {
  if (++count > limits_.max_nodes_in_document) {
    // Named by the top-level field it happened under: inside, positions are those of the
    // anchors the aliases repeat, not of where the expansion is.
    add(top_at_, top_path_,
        "the document expands to more than " + std::to_string(limits_.max_nodes_in_document) +
            " YAML nodes (each use of an alias counts again)");
    return false;
  }
  if (depth > limits_.max_depth) {
    add(position_of(node.Mark()), path,
        "nested more than " + std::to_string(limits_.max_depth) + " levels deep");
    return false;
  }
  if (node.IsSequence()) {
    std::size_t index = 0;
    for (auto it = node.begin(); it != node.end(); ++it, ++index) {
      if (!walk_bounds(*it, depth + 1, path + "[" + std::to_string(index) + "]", count)) return false;
    }
  } else if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string child = join_path(path, it->first.IsScalar() ? path_component(it->first.Scalar()) : "?");
      if (depth == 1) {
        top_at_ = position_of(it->first.Mark());
        top_path_ = child;
      }
      if (!walk_bounds(it->first, depth + 1, child, count)) return false;
      if (!walk_bounds(it->second, depth + 1, child, count)) return false;
    }
  }
  return true;
}

// Calls visit(name, entry) once per distinct scalar key, in file order. yaml-cpp keeps
// every pair of a map with a repeated key and lookups see only the first, so repeats are
// found here rather than silently ignored.
template <typename Visit>
void SpecReader::for_each_entry(const YAML::Node& map, const std::string& path, Visit&& visit) {
  std::map<std::string, Position, std::less<>> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    Entry entry{it->first, it->second, {}, position_of(it->first.Mark()), {}};
    Position value_at = position_of(it->second.Mark());
    entry.value_at = (it->second.IsNull() || value_at.line == 0 || before(value_at, entry.key_at))
                         ? entry.key_at
                         : value_at;
    if (!entry.key.IsScalar()) {
      add(entry.key_at, path, "keys must be plain words, got " + describe(entry.key) + " as a key");
      continue;
    }
    const std::string& name = entry.key.Scalar();
    entry.path = join_path(path, path_component(name));
    if (auto first = seen.find(name); first != seen.end()) {
      add(entry.key_at, entry.path, "duplicate key; first set on line " + std::to_string(first->second.line));
      continue;
    }
    seen.emplace(name, entry.key_at);
    visit(name, entry);
  }
}

Fields SpecReader::read_fields(const YAML::Node& map, const std::string& path,
                               std::span<const std::string_view> known) {
  Fields fields;
  for_each_entry(map, path, [&](const std::string& name, const Entry& entry) {
    auto match = std::find(known.begin(), known.end(), name);
    if (match != known.end()) {
      fields.emplace(*match, entry);
      return;
    }
    std::string message = "unknown field";
    if (name == "<<") {
      message += "; YAML merge keys are not supported";
    } else if (auto near = closest_match(name, known)) {
      message += "; did you mean \"" + std::string(*near) + "\"?";
    } else {
      message += "; expected one of " + join_names(known);
    }
    add(entry.key_at, entry.path, std::move(message));
  });
  return fields;
}

void SpecReader::require(const Fields& fields, std::string_view name, const std::string& path,
                         Position map_at) {
  if (!fields.contains(name)) add(map_at, join_path(path, name), "required field is missing");
}

bool SpecReader::expect_map(const Entry& entry, std::string_view expectation) {
  if (entry.value.IsMap()) return true;
  add(entry.value_at, entry.path, std::string(expectation) + ", got " + describe(entry.value));
  return false;
}

std::optional<std::string> SpecReader::read_scalar(const Entry& entry, std::string_view expectation) {
  if (entry.value.IsScalar()) return entry.value.Scalar();
  add(entry.value_at, entry.path, std::string(expectation) + ", got " + describe(entry.value));
  return std::nullopt;
}

bool SpecReader::check_text(Position at, const std::string& path, std::string_view text,
                            std::size_t max_bytes) {
  if (text.size() > max_bytes) {
    add(at, path,
        "is " + std::to_string(text.size()) + " bytes long; the limit is " + std::to_string(max_bytes));
    return false;
  }
  // Every string ends up in argv, envp or a path: C strings, where a NUL silently cuts.
  if (text.find('\0') != std::string_view::npos) {
    add(at, path, "must not contain a NUL character");
    return false;
  }
  return true;
}

std::optional<std::string> SpecReader::read_string(const Entry& entry, std::string_view expectation,
                                                   std::size_t max_bytes) {
  auto text = read_scalar(entry, expectation);
  if (!text || !check_text(entry.value_at, entry.path, *text, max_bytes)) return std::nullopt;
  return text;
}

std::optional<int> SpecReader::read_positive(const Entry& entry, std::int64_t max) {
  auto text = read_scalar(entry, "must be a positive integer");
  if (!text) return std::nullopt;
  auto value = parse_integer(*text);
  if (!value || *value < 1) {
    add(entry.value_at, entry.path, "must be a positive integer, got " + quote_for_message(*text));
    return std::nullopt;
  }
  if (*value > max) {
    add(entry.value_at, entry.path,
        "must be at most " + std::to_string(max) + ", got " + quote_for_message(*text));
    return std::nullopt;
  }
  return static_cast<int>(*value);
}

std::optional<int> SpecReader::read_in_range(const Entry& entry, std::int64_t lo, std::int64_t hi) {
  std::string expectation = "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  auto text = read_scalar(entry, expectation);
  if (!text) return std::nullopt;
  auto value = parse_integer(*text);
  if (!value || *value < lo || *value > hi) {
    add(entry.value_at, entry.path, expectation + ", got " + quote_for_message(*text));
    return std::nullopt;
  }
  return static_cast<int>(*value);
}

std::optional<JobSpec> SpecReader::read(const YAML::Node& root) {
  std::size_t problems_before = problems_.size();
  JobSpec spec;
  Position root_at = position_of(root.Mark());
  Fields top = read_fields(root, "", kTopFields);
  require(top, "name", "", root_at);
  require(top, "command", "", root_at);
  require(top, "resources", "", root_at);

  if (auto it = top.find("name"); it != top.end()) read_name(it->second, spec);
  if (auto it = top.find("command"); it != top.end()) read_command(it->second, spec);
  if (auto it = top.find("workdir"); it != top.end()) read_workdir(it->second, spec);
  if (auto it = top.find("env"); it != top.end()) read_env(it->second, spec);
  if (auto it = top.find("export"); it != top.end()) read_export(it->second, spec);
  ResourceFields resources;
  if (auto it = top.find("resources"); it != top.end()) resources = read_resources(it->second, spec);
  LaunchFields launch;
  if (auto it = top.find("launch"); it != top.end()) launch = read_launch(it->second, spec);
  if (auto it = top.find("resources"); it != top.end() && it->second.value.IsMap()) {
    check_shape(it->second, resources, launch, spec);
  }
  if (auto it = top.find("time_limit"); it != top.end()) read_time_limit(it->second, spec);
  if (auto it = top.find("priority"); it != top.end()) {
    if (auto value = read_in_range(it->second, -1000, 1000)) spec.priority = *value;
  }
  if (auto it = top.find("retries"); it != top.end()) {
    if (auto value = read_in_range(it->second, 0, 10)) spec.retries = *value;
  }
  for (DependencyKind kind : {DependencyKind::AfterOk, DependencyKind::AfterAny, DependencyKind::AfterNotOk}) {
    if (auto it = top.find(to_string(kind)); it != top.end()) read_dependencies(it->second, kind, spec);
  }
  if (auto it = top.find("array"); it != top.end()) {
    if (auto text = read_scalar(it->second, "must be indices like \"0-99%8\"")) {
      if (auto array = parse_array(*text)) {
        spec.array = std::move(*array);
      } else {
        add(it->second.value_at, it->second.path, array.error().message());
      }
    }
  }
  if (problems_.size() != problems_before) return std::nullopt;
  return spec;
}

void SpecReader::read_dependencies(const Entry& entry, DependencyKind kind, JobSpec& spec) {
  constexpr std::string_view kExpectation = "must be a job id (a positive integer)";
  auto one = [&](const YAML::Node& item, const std::string& path, Position at) {
    if (!item.IsScalar()) {
      add(at, path, std::string(kExpectation) + ", got " + describe(item));
      return;
    }
    auto id = parse_integer(item.Scalar());
    if (!id || *id < 1) {
      add(at, path, std::string(kExpectation) + ", got " + quote_for_message(item.Scalar()));
      return;
    }
    spec.dependencies.push_back({kind, *id});
  };
  if (!entry.value.IsSequence()) return one(entry.value, entry.path, entry.value_at);
  if (entry.value.size() == 0) return add(entry.value_at, entry.path, "must not be an empty list");
  if (entry.value.size() > kMaxDependencies) {
    return add(entry.value_at, entry.path,
               "lists " + std::to_string(entry.value.size()) + " jobs; the limit is " + std::to_string(kMaxDependencies));
  }
  std::size_t index = 0;
  for (auto it = entry.value.begin(); it != entry.value.end(); ++it, ++index) {
    const YAML::Node& item = *it;
    one(item, entry.path + "[" + std::to_string(index) + "]", item.IsNull() ? entry.value_at : position_of(item.Mark()));
  }
}

void SpecReader::read_name(const Entry& entry, JobSpec& spec) {
  constexpr std::string_view kExpectation = "must be 1 to 64 letters, digits, '.', '_' or '-'";
  auto text = read_scalar(entry, kExpectation);
  if (!text) return;
  if (!valid_job_name(*text)) {
    add(entry.value_at, entry.path, std::string(kExpectation) + ", got " + quote_for_message(*text));
    return;
  }
  spec.name = *text;
}

void SpecReader::read_export(const Entry& entry, JobSpec& spec) {
  constexpr std::string_view kExpectation = "must be ALL, NONE or a list of variable names";
  const YAML::Node& value = entry.value;
  if (value.IsScalar()) {
    auto choice = parse_export_choice(value.Scalar(), entry.path);
    if (!choice) {
      add(entry.value_at, entry.path, std::string(kExpectation) + ", got " + quote_for_message(value.Scalar()));
      return;
    }
    spec.export_env = *choice;
    return;
  }
  if (!value.IsSequence()) {
    add(entry.value_at, entry.path, std::string(kExpectation) + ", got " + describe(value));
    return;
  }
  ExportChoice choice{false, {}};
  std::size_t index = 0;
  bool ok = true;
  for (auto it = value.begin(); it != value.end(); ++it, ++index) {
    std::string path = entry.path + "[" + std::to_string(index) + "]";
    const YAML::Node& item = *it;
    Position at = item.IsNull() ? entry.value_at : position_of(item.Mark());
    if (!item.IsScalar() || !valid_env_name(item.Scalar())) {
      add(at, path, "must be a variable name ([A-Za-z_][A-Za-z0-9_]*)");
      ok = false;
      continue;
    }
    if (auto problem = reserved_env_problem(item.Scalar())) {
      add(at, path, "corral sets " + item.Scalar() + " itself; it cannot be exported");
      ok = false;
      continue;
    }
    choice.names.push_back(item.Scalar());
  }
  if (ok) spec.export_env = std::move(choice);
}

void SpecReader::read_command(const Entry& entry, JobSpec& spec) {
  const YAML::Node& value = entry.value;
  if (value.IsScalar()) {
    const std::string& text = value.Scalar();
    if (!check_text(entry.value_at, entry.path, text, limits_.max_command_bytes)) return;
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
      add(entry.value_at, entry.path, "must not be empty");
      return;
    }
    spec.command = Command{true, {text}};
    return;
  }
  if (!value.IsSequence()) {
    add(entry.value_at, entry.path,
        "must be a string (run by /bin/sh -c) or a list of strings (run directly), got " + describe(value));
    return;
  }
  if (value.size() == 0) {
    add(entry.value_at, entry.path, "must not be an empty list");
    return;
  }
  Command command{false, {}};
  std::size_t total_bytes = 0;
  bool ok = true;
  std::size_t index = 0;
  for (auto it = value.begin(); it != value.end(); ++it, ++index) {
    std::string path = entry.path + "[" + std::to_string(index) + "]";
    const YAML::Node& item = *it;
    Position at = item.IsNull() ? entry.value_at : position_of(item.Mark());
    if (!item.IsScalar()) {
      add(at, path, "must be a string, got " + describe(item));
      ok = false;
      continue;
    }
    const std::string& text = item.Scalar();
    if (!check_text(at, path, text, limits_.max_string_bytes)) {
      ok = false;
      continue;
    }
    if (index == 0 && text.empty()) {
      add(at, path, "the program to run must not be empty");
      ok = false;
      continue;
    }
    total_bytes += text.size();
    command.argv.push_back(text);
  }
  if (ok && total_bytes > limits_.max_command_bytes) {
    add(entry.value_at, entry.path,
        "is " + std::to_string(total_bytes) + " bytes long in all; the limit is " +
            std::to_string(limits_.max_command_bytes));
    return;
  }
  if (ok) spec.command = std::move(command);
}

void SpecReader::read_workdir(const Entry& entry, JobSpec& spec) {
  auto text = read_string(entry, "must be an absolute path", limits_.max_string_bytes);
  if (!text) return;
  if (text->empty() || text->front() != '/') {
    add(entry.value_at, entry.path, "must be an absolute path, got " + quote_for_message(*text));
    return;
  }
  spec.workdir = *text;
}

void SpecReader::read_env(const Entry& entry, JobSpec& spec) {
  if (!expect_map(entry, "must be a map of NAME: value")) return;
  std::size_t entries = 0;
  std::size_t bytes = 0;
  for_each_entry(entry.value, entry.path, [&](const std::string& name, const Entry& var) {
    ++entries;
    bytes += name.size();
    if (!check_text(var.key_at, var.path, name, limits_.max_string_bytes)) return;
    if (!valid_env_name(name)) {
      add(var.key_at, var.path,
          "is not a valid variable name (letters, digits and '_', not starting with a digit)");
      return;
    }
    if (auto reserved = reserved_env_problem(name)) {
      add(var.key_at, var.path, std::move(*reserved));
      return;
    }
    if (var.value.IsNull()) {
      add(var.value_at, var.path, "must be a value; write \"\" for an empty string");
      return;
    }
    // Numbers and booleans arrive as their text, which is what a process sees anyway.
    auto text = read_string(var, "must be a string, number or boolean", limits_.max_string_bytes);
    if (!text) return;
    bytes += text->size();
    spec.env.emplace_back(name, *text);
  });
  Position at = entry.value_at;
  if (entries > limits_.max_env_entries) {
    add(at, entry.path,
        "has " + std::to_string(entries) + " entries; the limit is " +
            std::to_string(limits_.max_env_entries));
  }
  if (bytes > limits_.max_env_bytes) {
    add(at, entry.path,
        "holds " + std::to_string(bytes) + " bytes of names and values; the limit is " +
            std::to_string(limits_.max_env_bytes));
  }
}

ResourceFields SpecReader::read_resources(const Entry& entry, JobSpec& spec) {
  ResourceFields res;
  if (!expect_map(entry, "must be a map with gpus_per_node or gpus")) return res;
  Fields fields = read_fields(entry.value, entry.path, kResourceFields);
  if (auto it = fields.find("nodes"); it != fields.end()) {
    res.nodes_entry = it->second;
    res.nodes = read_positive(it->second, limits_.max_nodes);
  }
  if (auto it = fields.find("gpus_per_node"); it != fields.end()) {
    res.gpus_per_node_entry = it->second;
    res.gpus_per_node = read_positive(it->second, limits_.max_gpus_per_node);
  }
  if (auto it = fields.find("gpus"); it != fields.end()) {
    res.gpus_entry = it->second;
    res.gpus = read_positive(it->second, std::int64_t{limits_.max_nodes} * limits_.max_gpus_per_node);
  }
  if (auto it = fields.find("gpu"); it != fields.end()) read_gpu(it->second, spec.gpu);
  return res;
}

void SpecReader::read_gpu(const Entry& entry, GpuConstraint& gpu) {
  if (!expect_map(entry, "must be a map with model, min_memory_gb or min_cuda")) return;
  Fields fields = read_fields(entry.value, entry.path, kGpuFields);
  if (auto it = fields.find("model"); it != fields.end()) {
    const Entry& model = it->second;
    if (auto text = read_string(model, "must be a GPU name or a glob", limits_.max_string_bytes)) {
      if (text->empty()) {
        add(model.value_at, model.path, "must not be empty; leave model out to accept any GPU");
      } else {
        gpu.model = *text;
      }
    }
  }
  if (auto it = fields.find("min_memory_gb"); it != fields.end()) {
    const Entry& memory = it->second;
    constexpr std::string_view kExpectation = "must be a positive number of GB like 40 or 39.5";
    if (auto text = read_scalar(memory, kExpectation)) {
      auto gb = parse_decimal(*text);
      if (!gb || *gb * 1024 < 1) {
        add(memory.value_at, memory.path, std::string(kExpectation) + ", got " + quote_for_message(*text));
      } else if (*gb > kMaxMemoryGb) {
        add(memory.value_at, memory.path,
            "must be at most " + std::to_string(static_cast<int>(kMaxMemoryGb)) + ", got " +
                quote_for_message(*text));
      } else {
        // Rounded down: asking for 39.5 GB must not exclude a card that has 40448 MiB.
        gpu.min_memory_mib = static_cast<std::int64_t>(*gb * 1024);
      }
    }
  }
  if (auto it = fields.find("min_cuda"); it != fields.end()) {
    const Entry& cuda = it->second;
    constexpr std::string_view kExpectation = "must be a CUDA version like 12.1";
    if (auto text = read_scalar(cuda, kExpectation)) {
      // An unquoted 12.1 is a YAML float, but yaml-cpp keeps its text, so "12.10" stays 12.10.
      if (auto version = CudaVersion::parse(*text)) {
        gpu.min_cuda = *version;
      } else {
        add(cuda.value_at, cuda.path, std::string(kExpectation) + ", got " + quote_for_message(*text));
      }
    }
  }
}

LaunchFields SpecReader::read_launch(const Entry& entry, JobSpec& spec) {
  LaunchFields launch;
  if (!expect_map(entry, "must be a map with mode, procs_per_node, gpu_visibility, rendezvous_timeout, "
                         "on_rendezvous_timeout or hang_timeout")) {
    return launch;
  }
  Fields fields = read_fields(entry.value, entry.path, kLaunchFields);
  if (auto it = fields.find("mode"); it != fields.end()) {
    constexpr LaunchMode kModes[] = {LaunchMode::Torch, LaunchMode::Nccl};
    if (auto mode = read_choice(it->second, kModes, "must be torch or nccl")) spec.mode = *mode;
  }
  if (auto it = fields.find("gpu_visibility"); it != fields.end()) {
    constexpr GpuVisibility kVisibilities[] = {GpuVisibility::Node, GpuVisibility::Rank};
    if (auto v = read_choice(it->second, kVisibilities, "must be node or rank")) spec.gpu_visibility = *v;
  }
  // A duration, or 0 for none.
  auto timeout = [&](std::string_view name, Duration& out) {
    auto it = fields.find(name);
    if (it == fields.end()) return;
    const Entry& e = it->second;
    if (auto text = read_scalar(e, "must be a duration like 5m, or 0 for none")) {
      if (*text == "0") {
        out = Duration(0);
      } else if (auto duration = parse_duration(*text)) {
        out = *duration;
      } else {
        add(e.value_at, e.path, duration.error().message() + ", or 0 for none");
      }
    }
  };
  timeout("rendezvous_timeout", spec.rendezvous_timeout);
  timeout("hang_timeout", spec.hang_timeout);
  if (auto it = fields.find("on_rendezvous_timeout"); it != fields.end()) {
    constexpr OnRendezvousTimeout kActions[] = {OnRendezvousTimeout::Fail, OnRendezvousTimeout::Warn};
    if (auto action = read_choice(it->second, kActions, "must be fail or warn")) spec.on_rendezvous_timeout = *action;
  }
  if (auto it = fields.find("procs_per_node"); it != fields.end()) {
    const Entry& procs = it->second;
    launch.procs_entry = procs;
    constexpr std::string_view kExpectation = "must be \"gpus\" or a positive integer";
    if (auto text = read_scalar(procs, kExpectation)) {
      auto value = parse_integer(*text);
      if (*text == "gpus") {
        launch.procs_per_node = 0;
      } else if (!value || *value < 1) {
        add(procs.value_at, procs.path, std::string(kExpectation) + ", got " + quote_for_message(*text));
      } else if (*value > limits_.max_gpus_per_node) {
        add(procs.value_at, procs.path,
            "must be at most " + std::to_string(limits_.max_gpus_per_node) + ", got " +
                quote_for_message(*text));
      } else {
        launch.procs_per_node = static_cast<int>(*value);
      }
    }
  }
  return launch;
}

void SpecReader::read_time_limit(const Entry& entry, JobSpec& spec) {
  auto text = read_scalar(entry, "must be a duration like 2h or 90m");
  if (!text) return;
  auto duration = parse_duration(*text);
  if (!duration) {
    add(entry.value_at, entry.path, duration.error().message());
    return;
  }
  spec.time_limit = *duration;
}

// The checks that need resources and launch together. Each runs only when the fields it
// reads are valid on their own, so one mistake is reported once.
void SpecReader::check_shape(const Entry& resources, const ResourceFields& res, const LaunchFields& launch,
                             JobSpec& spec) {
  if (!res.gpus_per_node_entry && !res.gpus_entry) {
    add(resources.value_at, resources.path,
        "needs gpus_per_node (GPUs on each node) or gpus (GPUs in total)");
    return;
  }
  if (res.gpus_per_node_entry && res.gpus_entry) {
    add(res.gpus_entry->key_at, res.gpus_entry->path, "give gpus_per_node or gpus, not both");
    return;
  }
  if (launch.procs_entry && !launch.procs_per_node) return;
  const int procs = launch.procs_per_node.value_or(0);
  const auto quoted = [](const Entry& e) { return quote_for_message(e.value.Scalar()); };

  std::int64_t ranks = 0;
  if (res.gpus_per_node_entry) {
    if (!res.gpus_per_node) return;
    spec.nodes = res.nodes.value_or(1);  // an invalid nodes was reported; the result is discarded
    spec.gpus_per_node = res.gpus_per_node;
    if (procs > 0 && *res.gpus_per_node % procs != 0) {
      add(launch.procs_entry->value_at, launch.procs_entry->path,
          "must divide resources.gpus_per_node (" + std::to_string(*res.gpus_per_node) + "), got " +
              quoted(*launch.procs_entry));
      return;
    }
    if (res.nodes_entry && !res.nodes) return;
    ranks = std::int64_t{*spec.nodes} * (procs > 0 ? procs : *res.gpus_per_node);
  } else if (res.nodes_entry) {
    if (!res.nodes || !res.gpus) return;
    const Entry& gpus = *res.gpus_entry;
    if (*res.gpus % *res.nodes != 0) {
      add(gpus.value_at, gpus.path,
          "must be a multiple of resources.nodes (" + std::to_string(*res.nodes) + "), got " + quoted(gpus));
      return;
    }
    int share = *res.gpus / *res.nodes;
    if (share > limits_.max_gpus_per_node) {
      add(gpus.value_at, gpus.path,
          "puts " + std::to_string(share) + " GPUs on each node; the limit is " +
              std::to_string(limits_.max_gpus_per_node));
      return;
    }
    spec.nodes = res.nodes;
    spec.total_gpus = res.gpus;
    if (procs > 0 && share % procs != 0) {
      add(launch.procs_entry->value_at, launch.procs_entry->path,
          "must divide each node's share of resources.gpus (" + std::to_string(share) + "), got " +
              quoted(*launch.procs_entry));
      return;
    }
    ranks = std::int64_t{*res.nodes} * (procs > 0 ? procs : share);
  } else {
    if (!res.gpus) return;
    const auto fitting = [&](const JobSpec& candidate) {
      auto shapes = candidate_shapes(candidate);
      std::erase_if(shapes, [&](const std::pair<int, int>& shape) {
        return shape.first > limits_.max_nodes || shape.second > limits_.max_gpus_per_node;
      });
      return shapes;
    };
    spec.total_gpus = res.gpus;
    if (fitting(spec).empty()) {
      add(res.gpus_entry->value_at, res.gpus_entry->path,
          "cannot be spread evenly over at most " + std::to_string(limits_.max_nodes) + " nodes of at most " +
              std::to_string(limits_.max_gpus_per_node) + " GPUs, got " + quoted(*res.gpus_entry));
      return;
    }
    spec.procs_per_node = procs;
    auto shapes = fitting(spec);
    if (shapes.empty()) {
      add(launch.procs_entry->value_at, launch.procs_entry->path,
          "must divide the GPUs per node for some way to spread resources.gpus (" +
              std::to_string(*res.gpus) + ") over nodes, got " + quoted(*launch.procs_entry));
      return;
    }
    // The scheduler may pick any of these shapes, so the largest must fit.
    for (const auto& [nodes, per_node] : shapes) {
      ranks = std::max(ranks, std::int64_t{nodes} * (procs > 0 ? procs : per_node));
    }
  }
  spec.procs_per_node = procs;
  if (ranks > limits_.max_ranks) {
    add(resources.value_at, resources.path,
        "the job would start " + std::to_string(ranks) +
            " processes (nodes x processes per node); the limit is " + std::to_string(limits_.max_ranks));
  }
}

void sort_in_document_order(std::vector<SpecProblem>& problems) {
  std::stable_sort(problems.begin(), problems.end(), [](const SpecProblem& a, const SpecProblem& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
}

bool indented_with_tab(std::string_view text, int line) {
  std::size_t begin = 0;
  for (int i = 0; i < line && begin != std::string_view::npos; ++i) {
    begin = text.find('\n', begin);
    if (begin != std::string_view::npos) ++begin;
  }
  if (line < 0 || begin == std::string_view::npos) return false;
  std::string_view rest = text.substr(begin);
  std::size_t indent_end = rest.find_first_not_of(" \t");
  return rest.substr(0, indent_end).find('\t') != std::string_view::npos;
}

// A shell script given where a spec belongs (an sbatch script, most often): it begins
// with "#!" or has a line beginning "#SBATCH". YAML reads those lines as comments, so the
// parser's own complaint would be about the script's first command.
bool looks_like_script(std::string_view text) {
  if (text.starts_with("#!")) return true;
  for (std::size_t at = 0; at < text.size();) {
    if (text.substr(at).starts_with("#SBATCH")) return true;
    at = text.find('\n', at);
    if (at == std::string_view::npos) break;
    ++at;
  }
  return false;
}

constexpr std::string_view kScriptHint =
    " (this looks like a shell script: a spec is YAML; to run a script, give it as the command, "
    "e.g. corral submit -N 2 --gpus-per-node 4 -- bash job.sh; docs/cli.md, \"Coming from Slurm\")";

// Where the second document's first node is, if the text holds a second document with
// something in it. Read
// with the parser's events, and at most three documents: yaml-cpp 0.7's LoadAll never
// ends on some inputs (a document that begins with ',' yields empty documents forever,
// each one a node, until memory runs out).
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { content(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    content(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    content(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    content(mark);
  }
  void OnMapEnd() override {}

  std::optional<YAML::Mark> second;

 private:
  void content(const YAML::Mark& mark) {
    if (documents_ >= 2 && !second) second = mark;
  }
  int documents_ = 0;
};

std::optional<YAML::Mark> second_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  for (int i = 0; i < 3 && !counter.second && parser.HandleNextDocument(counter); ++i) {
  }
  return counter.second;
}

SpecParseResult parse_document(std::string_view yaml_text, const SpecLimits& limits) {
  SpecParseResult result;
  auto& problems = result.problems;
  if (yaml_text.size() > limits.max_file_bytes) {
    problems.push_back({0, 0, "",
                        "file is " + std::to_string(yaml_text.size()) + " bytes; the limit is " +
                            std::to_string(limits.max_file_bytes)});
    return result;
  }
  YAML::Node root;
  std::optional<YAML::Mark> second;
  try {
    std::string text(yaml_text);
    root = YAML::Load(text);
    second = second_document(text);
  } catch (const YAML::DeepRecursion& e) {
    Position at = position_of(e.mark);
    problems.push_back(
        {at.line, at.column, "", "nested more than " + std::to_string(limits.max_depth) + " levels deep"});
    return result;
  } catch (const YAML::ParserException& e) {
    Position at = position_of(e.mark);
    std::string message = "YAML syntax error: " + e.msg;
    // yaml-cpp's message for a tab in the indentation never mentions the tab.
    if (indented_with_tab(yaml_text, e.mark.line)) message += " (YAML does not allow tabs for indentation)";
    if (looks_like_script(yaml_text)) message += kScriptHint;
    problems.push_back({at.line, at.column, "", std::move(message)});
    return result;
  }
  if (!root.IsDefined() || root.IsNull()) {
    Position at = root.IsDefined() ? position_of(root.Mark()) : Position{};
    problems.push_back(
        {at.line, at.column, "", "the document is empty; a job needs at least name, command and resources"});
    return result;
  }
  if (second) {
    Position at = position_of(*second);
    problems.push_back({at.line, at.column, "", "found a second YAML document; a file holds one job"});
  }
  if (!root.IsMap()) {
    Position at = position_of(root.Mark());
    problems.push_back(
        {at.line, at.column, "",
         "the document must be a map of fields like name: and command:, got " + describe(root) +
             (looks_like_script(yaml_text) ? std::string(kScriptHint) : std::string())});
    return result;
  }
  SpecReader reader(limits, problems);
  if (!reader.within_bounds(root)) return result;
  auto spec = reader.read(root);
  if (problems.empty()) result.spec = std::move(spec);
  return result;
}

}  // namespace

SpecParseResult parse_job_spec_detailed(std::string_view yaml_text, const SpecLimits& limits) {
  SpecParseResult result;
  // yaml-cpp reports through exceptions, and an allocation can fail on hostile input:
  // none of it may reach the caller, which expects a value.
  try {
    result = parse_document(yaml_text, limits);
  } catch (const YAML::Exception& e) {
    Position at = position_of(e.mark);
    result = SpecParseResult{};
    result.problems.push_back({at.line, at.column, "", "YAML error: " + e.msg});
  } catch (const std::exception& e) {
    result = SpecParseResult{};
    result.problems.push_back({0, 0, "", std::string("could not be read: ") + e.what()});
  } catch (...) {
    result = SpecParseResult{};
    result.problems.push_back({0, 0, "", "could not be read"});
  }
  sort_in_document_order(result.problems);
  return result;
}

Result<JobSpec> parse_job_spec(std::string_view yaml_text, std::string_view file_name,
                               const SpecLimits& limits) {
  SpecParseResult result = parse_job_spec_detailed(yaml_text, limits);
  if (result.spec) return std::move(*result.spec);
  std::string message;
  for (const auto& problem : result.problems) {
    if (!message.empty()) message += '\n';
    message += problem.format(file_name);
  }
  if (message.empty()) message = std::string(file_name) + ": could not be read";
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

}  // namespace corral::model

namespace corral::model {

bool SpecOverrides::empty() const {
  return !name && !command && !nodes && !gpus_per_node && !gpus && !time_limit && !priority && !retries && !after_ok &&
         !after_any && !after_not_ok && !array && !procs_per_node;
}

std::vector<std::pair<std::string, std::string>> SpecOverrides::fields() const {
  std::vector<std::pair<std::string, std::string>> out;
  if (name) out.emplace_back("name", "--name");
  if (command) out.emplace_back("command", "-- COMMAND");
  if (nodes) out.emplace_back("resources.nodes", "--nodes");
  if (gpus_per_node) out.emplace_back("resources.gpus_per_node", "--gpus-per-node");
  if (gpus) out.emplace_back("resources.gpus", "--gpus");
  if (nodes || gpus_per_node || gpus) out.emplace_back("resources", gpus ? "--gpus" : gpus_per_node ? "--gpus-per-node" : "--nodes");
  if (time_limit) out.emplace_back("time_limit", "--time");
  if (priority) out.emplace_back("priority", "--priority");
  if (retries) out.emplace_back("retries", "--retries");
  if (after_ok) out.emplace_back("after_ok", "--after-ok");
  if (after_any) out.emplace_back("after_any", "--after-any");
  if (after_not_ok) out.emplace_back("after_not_ok", "--after-not-ok");
  if (array) out.emplace_back("array", "--array");
  if (procs_per_node) out.emplace_back("launch.procs_per_node", "--procs-per-node");
  return out;
}

namespace {

// An integer field of `map`, when it is one.
std::optional<std::int64_t> integer_field(const YAML::Node& map, const char* key) {
  const YAML::Node v = map[key];
  if (!v.IsDefined() || !v.IsScalar()) return std::nullopt;
  return spec_text::parse_integer(v.Scalar());
}

std::string overridden(std::string_view yaml_text, const SpecOverrides& o, const SpecLimits& limits) {
  YAML::Node root;
  if (!yaml_text.empty()) {
    if (yaml_text.size() > limits.max_file_bytes) return std::string(yaml_text);
    root = YAML::Load(std::string(yaml_text));
    if (second_document(std::string(yaml_text))) return std::string(yaml_text);
    std::vector<SpecProblem> problems;
    SpecReader reader(limits, problems);
    if (!root.IsMap() || !reader.within_bounds(root)) return std::string(yaml_text);
  } else {
    root = YAML::Node(YAML::NodeType::Map);
  }
  if (o.name) root["name"] = *o.name;
  if (o.command) {
    YAML::Node list(YAML::NodeType::Sequence);
    for (const auto& arg : *o.command) list.push_back(arg);
    root["command"] = list;
  }
  if (o.nodes || o.gpus_per_node || o.gpus || !root["resources"].IsDefined()) {
    YAML::Node res = root["resources"];
    if (!res.IsMap()) {
      res = YAML::Node(YAML::NodeType::Map);
      root["resources"] = res;
    }
    if (o.nodes) res["nodes"] = *o.nodes;
    if (o.gpus_per_node) {
      res["gpus_per_node"] = *o.gpus_per_node;
      res.remove("gpus");
    }
    if (o.gpus) {
      res["gpus"] = *o.gpus;
      res.remove("gpus_per_node");
    }
    // A total with a node count becomes a count per node when the nodes divide it.
    auto nodes = integer_field(res, "nodes");
    auto total = integer_field(res, "gpus");
    if (nodes && total && *nodes > 0 && *total % *nodes == 0) {
      res["gpus_per_node"] = *total / *nodes;
      res.remove("gpus");
    }
    if (!res["gpus"].IsDefined() && !res["gpus_per_node"].IsDefined()) res["gpus_per_node"] = 1;
  }
  if (o.time_limit) root["time_limit"] = *o.time_limit;
  if (o.priority) root["priority"] = *o.priority;
  if (o.retries) root["retries"] = *o.retries;
  auto ids = [&](const char* key, const std::optional<std::vector<std::int64_t>>& list) {
    if (!list) return;
    YAML::Node seq(YAML::NodeType::Sequence);
    for (auto id : *list) seq.push_back(id);
    root[key] = seq;
  };
  ids("after_ok", o.after_ok);
  ids("after_any", o.after_any);
  ids("after_not_ok", o.after_not_ok);
  if (o.array) root["array"] = *o.array;
  if (o.procs_per_node) {
    YAML::Node launch = root["launch"];
    if (!launch.IsMap()) {
      launch = YAML::Node(YAML::NodeType::Map);
      root["launch"] = launch;
    }
    launch["procs_per_node"] = *o.procs_per_node;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace

std::string apply_spec_overrides(std::string_view yaml_text, const SpecOverrides& overrides, const SpecLimits& limits) {
  if (overrides.empty() && !yaml_text.empty()) return std::string(yaml_text);
  try {
    return overridden(yaml_text, overrides, limits);
  } catch (const std::exception&) {
    // Not YAML the parser could read: it says why, with the position.
    return std::string(yaml_text);
  }
}

}  // namespace corral::model
