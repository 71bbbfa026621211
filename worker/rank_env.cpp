#include "worker/rank_env.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>

#include "common/core/strings.hpp"

namespace corral::worker {

namespace {

constexpr std::string_view kNames[] = {
    "WORLD_SIZE",  "RANK",        "LOCAL_RANK",    "LOCAL_WORLD_SIZE", "NODE_RANK",     "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "CORRAL_JOB_ID", "CORRAL_ATTEMPT",   "CORRAL_NNODES", "CORRAL_NODELIST",
};

std::unexpected<Error> invalid(std::string message) {
  return make_error(ErrorCode::InvalidArgument, std::move(message));
}

std::string_view value_of(const EnvMap& env, std::string_view name) {
  auto it = env.find(name);
  return it == env.end() ? std::string_view() : std::string_view(it->second);
}

// Digits only: no sign, no spaces, no hex, so "1e3" or " 4" are refused rather than
// read as something the launcher did not mean.
Result<std::int64_t> parse_number(const EnvMap& env, std::string_view name, std::int64_t max) {
  std::string_view text = value_of(env, name);
  std::string shown = std::string(name) + "=" + quote_for_message(text);
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return invalid(shown + " is not a non-negative integer");
  }
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value > max) {
    return invalid(std::string(name) + "=" + std::string(text) + " is too large (at most " +
                   std::to_string(max) + ")");
  }
  return value;
}

std::string count_of(std::size_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

// Splits a comma-separated list, refusing empty items and repeats: either would make a
// count check pass for the wrong reason.
Result<std::vector<std::string>> split_list(std::string_view name, std::string_view text,
                                            std::string_view item_kind) {
  std::vector<std::string> items;
  std::set<std::string, std::less<>> seen;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    if (item.empty()) {
      return invalid(std::string(name) + "=" + quote_for_message(text) + " has an empty " +
                     std::string(item_kind));
    }
    if (!seen.insert(std::string(item)).second) {
      return invalid(std::string(name) + " names " + quote_for_message(item) + " twice");
    }
    items.emplace_back(item);
    if (items.size() > static_cast<std::size_t>(kMaxWorldSize)) {
      return invalid(std::string(name) + " has more than " + std::to_string(kMaxWorldSize) + " entries");
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

// Host names and IPv4/IPv6 literals (with a %scope). Whitespace and other punctuation
// would also break the one-line rendezvous hello, so they are refused here.
bool plausible_host(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == ':' || c == '_' || c == '%';
  });
}

}  // namespace

std::vector<std::string_view> rank_env_names() {
  return {std::begin(kNames), std::end(kNames)};
}

Result<RankEnv> parse_rank_env(const EnvMap& env, const RankEnvOptions& options) {
  std::string missing;
  for (std::string_view name : kNames) {
    if (value_of(env, name).empty()) missing += (missing.empty() ? "" : ", ") + std::string(name);
  }
  if (!missing.empty()) return invalid("missing environment: " + missing);

  RankEnv out;
  struct Field {
    std::string_view name;
    std::int64_t min;
    std::int64_t max;
    int* target;
  };
  const Field fields[] = {
      {"WORLD_SIZE", 1, kMaxWorldSize, &out.world_size},
      {"RANK", 0, 999'999'999, &out.rank},
      {"LOCAL_RANK", 0, 999'999'999, &out.local_rank},
      {"LOCAL_WORLD_SIZE", 1, kMaxWorldSize, &out.local_world_size},
      {"NODE_RANK", 0, 999'999'999, &out.node_rank},
      {"GROUP_RANK", 0, 999'999'999, &out.group_rank},
      {"MASTER_PORT", 1, 65535, &out.master_port},
      {"CORRAL_ATTEMPT", 0, 999'999'999, &out.attempt},
      {"CORRAL_NNODES", 1, kMaxWorldSize, &out.nnodes},
  };
  for (const Field& f : fields) {
    // MASTER_PORT's bound is a range, not a size: say so rather than "too large".
    std::int64_t parse_max = f.name == "MASTER_PORT" ? 999'999'999 : f.max;
    auto value = parse_number(env, f.name, parse_max);
    if (!value) return std::unexpected(value.error());
    if (f.name == "MASTER_PORT" && (*value < f.min || *value > f.max)) {
      return invalid("MASTER_PORT=" + std::to_string(*value) + " is not a port number (1-65535)");
    }
    if (*value < f.min) {
      return invalid(std::string(f.name) + "=" + std::to_string(*value) + " must be at least " +
                     std::to_string(f.min));
    }
    *f.target = static_cast<int>(*value);
  }
  auto job = parse_number(env, "CORRAL_JOB_ID", 999'999'999'999'999'999);
  if (!job) return std::unexpected(job.error());
  out.job_id = *job;

  out.master_addr = std::string(value_of(env, "MASTER_ADDR"));
  if (!plausible_host(out.master_addr)) {
    return invalid("MASTER_ADDR=" + quote_for_message(out.master_addr) + " is not a host name or IP address");
  }

  auto eq = [](std::string_view name, std::int64_t v) { return std::string(name) + "=" + std::to_string(v); };
  if (out.rank >= out.world_size)
    return invalid(eq("WORLD_SIZE", out.world_size) + " but " + eq("RANK", out.rank));
  if (out.local_rank >= out.local_world_size) {
    return invalid(eq("LOCAL_WORLD_SIZE", out.local_world_size) + " but " + eq("LOCAL_RANK", out.local_rank));
  }
  if (out.node_rank >= out.nnodes) {
    return invalid(eq("CORRAL_NNODES", out.nnodes) + " but " + eq("NODE_RANK", out.node_rank));
  }
  if (out.group_rank != out.node_rank) {
    return invalid(eq("GROUP_RANK", out.group_rank) + " but " + eq("NODE_RANK", out.node_rank));
  }
  // torchrun's contract with equal ranks per node, which corral's allocations have.
  std::int64_t expected_world = std::int64_t{out.nnodes} * out.local_world_size;
  if (out.world_size != expected_world) {
    return invalid(eq("WORLD_SIZE", out.world_size) + " but " + eq("CORRAL_NNODES", out.nnodes) + " * " +
                   eq("LOCAL_WORLD_SIZE", out.local_world_size) + " = " + std::to_string(expected_world));
  }
  std::int64_t expected_rank = std::int64_t{out.node_rank} * out.local_world_size + out.local_rank;
  if (out.rank != expected_rank) {
    return invalid(eq("RANK", out.rank) + " but " + eq("NODE_RANK", out.node_rank) + " * " +
                   eq("LOCAL_WORLD_SIZE", out.local_world_size) + " + " + eq("LOCAL_RANK", out.local_rank) +
                   " = " + std::to_string(expected_rank));
  }

  auto nodes = split_list("CORRAL_NODELIST", value_of(env, "CORRAL_NODELIST"), "node name");
  if (!nodes) return std::unexpected(nodes.error());
  out.nodelist = std::move(*nodes);
  if (out.nodelist.size() != static_cast<std::size_t>(out.nnodes)) {
    return invalid("CORRAL_NODELIST names " + count_of(out.nodelist.size(), "node", "nodes") + " but " +
                   eq("CORRAL_NNODES", out.nnodes));
  }

  if (auto it = env.find(std::string_view("CUDA_VISIBLE_DEVICES")); it != env.end()) {
    out.cuda_visible_devices = it->second;
    if (!it->second.empty()) {
      auto devices = split_list("CUDA_VISIBLE_DEVICES", it->second, "entry");
      if (!devices) return std::unexpected(devices.error());
      out.visible_devices = std::move(*devices);
    }
  }
  if (options.gpus_per_rank) {
    int want = *options.gpus_per_rank;
    std::string flag = "--gpus-per-rank " + std::to_string(want);
    if (!out.cuda_visible_devices && want > 0) return invalid("CUDA_VISIBLE_DEVICES is not set but " + flag);
    if (out.visible_devices.size() != static_cast<std::size_t>(want)) {
      return invalid("CUDA_VISIBLE_DEVICES=" + quote_for_message(out.cuda_visible_devices.value_or("")) +
                     " lists " + count_of(out.visible_devices.size(), "device", "devices") + " but " + flag);
    }
  }
  return out;
}

EnvMap read_process_env() {
  EnvMap env;
  auto copy = [&](std::string_view name) {
    std::string key(name);
    if (const char* v = std::getenv(key.c_str())) env.emplace(std::move(key), v);
  };
  for (std::string_view name : kNames) copy(name);
  copy("CUDA_VISIBLE_DEVICES");
  copy("CORRAL_NCCL_UNIQUE_ID");
  return env;
}

}  // namespace corral::worker
