#pragma once
// Parses and validates a job spec written in YAML. yaml-cpp stays inside the .cpp.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/core/error.hpp"
#include "common/model/job_spec.hpp"

namespace corral::model {

// Bounds on what a spec may hold; the defaults are what the coordinator enforces.
struct SpecLimits {
  std::size_t max_file_bytes = 64 * 1024;
  int max_depth = 8;
  std::size_t max_nodes_in_document = 4096;   // YAML nodes after alias expansion
  std::size_t max_string_bytes = 4096;        // any single string value, env names too
  std::size_t max_command_bytes = 16 * 1024;  // the whole command (a command string has only this bound)
  std::size_t max_env_entries = 256;
  std::size_t max_env_bytes = 32 * 1024;      // keys + values
  int max_nodes = 1024;                       // resources.nodes
  int max_gpus_per_node = 64;
  int max_ranks = 65536;                      // nodes x processes per node
};

// One problem found in a spec. Problems about the file as a whole (too large, empty, too
// many YAML nodes) have line 0 and format without a position: "job.yaml: message".
struct SpecProblem {
  int line = 0;      // 1-based; 0 when the problem has no position (e.g. file too large)
  int column = 0;    // 1-based
  std::string path;  // "resources.gpus_per_node"; empty for the document itself
  std::string message;

  // "job.yaml:7:18: resources.gpus_per_node: must be a positive integer, got \"four\""
  // "job.yaml: file is 70000 bytes; the limit is 65536"
  std::string format(std::string_view file_name) const;
};

struct SpecParseResult {
  std::optional<JobSpec> spec;          // set when problems is empty
  std::vector<SpecProblem> problems;    // every problem found, in document order
};

// Never throws. A document over a size, depth or node-count bound gets that one problem
// and is not read further, as is one that is not valid YAML; otherwise every field is
// checked and every problem reported.
SpecParseResult parse_job_spec_detailed(std::string_view yaml_text, const SpecLimits& limits = {});

// InvalidArgument with every problem, one per line, each "file:line:col: path: message".
Result<JobSpec> parse_job_spec(std::string_view yaml_text, std::string_view file_name,
                               const SpecLimits& limits = {});

// Fields given on the command line (`corral submit --nodes 2 -- python train.py`), which
// replace the spec's own. Values are as typed; the parser checks them like any spec.
struct SpecOverrides {
  std::optional<std::string> name;
  std::optional<std::vector<std::string>> command;  // a list: executed without a shell
  std::optional<int> nodes;
  std::optional<int> gpus_per_node;
  std::optional<int> gpus;                          // in all
  std::optional<std::string> time_limit;
  std::optional<int> priority;
  std::optional<int> retries;
  std::optional<std::vector<std::int64_t>> after_ok;      // replace the spec's list
  std::optional<std::vector<std::int64_t>> after_any;
  std::optional<std::vector<std::int64_t>> after_not_ok;
  std::optional<std::string> array;                    // "0-99%8"
  std::optional<std::string> procs_per_node;           // "gpus" or a number, as typed

  bool empty() const;
  // The spec fields (as parser paths: "resources.nodes") these replace, each with the flag
  // that set it, so a problem in one can be named by its flag.
  std::vector<std::pair<std::string, std::string>> fields() const;
};

// The spec text with the overridden fields replaced, resources kept consistent: a
// per-node count replaces a total and the other way round; nodes with a total the nodes
// divide becomes a per-node count. From an empty text: a spec of these fields alone, with
// one GPU per node unless a count is given. Fields not named are kept as written (comments
// are not). Text that is not a YAML map within `limits` comes back unchanged, for the
// parser to report.
std::string apply_spec_overrides(std::string_view yaml_text, const SpecOverrides& overrides,
                                 const SpecLimits& limits = {});

}  // namespace corral::model
