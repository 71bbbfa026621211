#include "agent/inventory/gpu_inventory.hpp"

#include <signal.h>

#include <cerrno>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>

#include "common/model/sim_inventory_yaml.hpp"

namespace corral::agent {

namespace {

std::string describe(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& arg : argv) text += (text.empty() ? "" : " ") + arg;
  return "`" + text + "`";
}

std::vector<std::string> command(const std::string& nvidia_smi, std::span<const std::string_view> args) {
  std::vector<std::string> argv{nvidia_smi};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// Runs one nvidia-smi command; its stdout when it exited 0.
Result<std::string> run_nvidia_smi(const CommandRunner& run, const std::vector<std::string>& argv,
                                   Duration timeout) {
  auto output = run(argv, timeout);
  if (!output) {
    const Error& e = output.error();
    // No nvidia-smi at all: this node has no NVIDIA driver installed, which for a GPU
    // agent means the GPUs are unavailable, not that a request named something missing.
    if (e.code() == ErrorCode::NotFound) {
      return make_error(ErrorCode::Unavailable,
                        e.message() +
                            " (is the NVIDIA driver installed? Nodes without GPUs use a simulated "
                            "inventory file)");
    }
    return std::unexpected(e);
  }
  if (!output->succeeded()) return std::unexpected(nvidia_smi_failure(describe(argv), *output));
  return std::move(output->out);
}

}  // namespace

CommandRunner system_command_runner() {
  return [](const std::vector<std::string>& argv, Duration timeout) { return run_command(argv, timeout); };
}

Result<Inventory> read_nvidia_inventory(const CommandRunner& run, const std::string& nvidia_smi,
                                        Duration timeout) {
  const auto query_argv = command(nvidia_smi, kQueryGpuArgs);
  auto query = run_nvidia_smi(run, query_argv, timeout);
  if (!query) return std::unexpected(query.error());
  auto rows = parse_query_gpu(*query);
  if (!rows) return std::unexpected(rows.error());
  if (rows->empty()) {
    return make_error(ErrorCode::Unavailable, describe(query_argv) + " listed no GPUs");
  }

  const auto banner_argv = command(nvidia_smi, {});
  auto banner = run_nvidia_smi(run, banner_argv, timeout);
  if (!banner) return std::unexpected(banner.error());
  auto cuda = parse_cuda_version(*banner);
  if (!cuda) return std::unexpected(cuda.error().with_context(describe(banner_argv)));

  Inventory inventory;
  inventory.cuda = *cuda;
  inventory.driver = rows->front().driver;

  // NVLink only steers placement; a node whose topology cannot be read still runs jobs.
  std::map<int, std::vector<int>> nvlink;
  const auto topo_argv = command(nvidia_smi, kTopoArgs);
  auto topo = run_nvidia_smi(run, topo_argv, timeout);
  auto parsed = topo ? parse_topo_nvlink(*topo) : std::unexpected(topo.error());
  if (parsed) {
    nvlink = std::move(*parsed);
  } else {
    inventory.warnings.push_back("NVLink unknown: " + parsed.error().message());
  }

  auto gpus = assemble_gpus(*rows, *cuda, nvlink);
  if (!gpus) return std::unexpected(gpus.error());
  inventory.gpus = std::move(*gpus);
  return inventory;
}

Result<std::vector<ComputeApp>> read_compute_apps(const CommandRunner& run, const std::string& nvidia_smi,
                                                  Duration timeout) {
  auto out = run_nvidia_smi(run, command(nvidia_smi, kQueryComputeAppsArgs), timeout);
  if (!out) return std::unexpected(out.error());
  return parse_compute_apps(*out);
}

Result<std::map<int, int>> read_gpu_utilization(const CommandRunner& run, const std::string& nvidia_smi,
                                                Duration timeout) {
  auto out = run_nvidia_smi(run, command(nvidia_smi, kQueryUtilizationArgs), timeout);
  if (!out) return std::unexpected(out.error());
  return parse_gpu_utilization(*out);
}

namespace {
constexpr std::size_t kMaxSimOutputBytes = 1 << 20;

// A recorded nvidia-smi answer of a simulated node: "" when the file is not there.
Result<std::string> read_recorded_output(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::string();
  std::string text(kMaxSimOutputBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxSimOutputBytes)
    return make_error(ErrorCode::InvalidArgument, file + ": larger than 1 MiB");
  return text;
}

std::string beside(const std::string& inventory, const std::string& file) {
  std::filesystem::path p(file);
  return p.is_absolute() ? p.string() : (std::filesystem::path(inventory).parent_path() / p).string();
}
}  // namespace

Result<Inventory> read_simulated_inventory(const std::string& path, std::string_view node) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::NotFound, "cannot read simulated inventory " + path);
  // Read one byte past the parser's bound so that it, not this loop, reports a file
  // that is too large (and a path like /dev/zero cannot fill memory).
  std::string text(model::kMaxSimInventoryBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return make_error(ErrorCode::Unavailable, "error reading simulated inventory " + path);
  text.resize(static_cast<std::size_t>(in.gcount()));
  auto sim = model::parse_sim_inventory(text, path);
  if (!sim) return std::unexpected(sim.error());
  Inventory inventory;
  inventory.gpus = std::move(sim->gpus);
  if (!node.empty()) {
    std::uint32_t hash = 2166136261u;  // FNV-1a
    for (char c : node) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
    std::array<char, 9> hex{};
    std::snprintf(hex.data(), hex.size(), "%08x", hash);
    for (auto& gpu : inventory.gpus) gpu.uuid.replace(8, 8, hex.data(), 8);  // GPU-sim-XXXXXXXX-...
  }
  inventory.cuda = sim->cuda;
  inventory.driver = std::move(sim->driver);
  inventory.simulated = true;
  if (!sim->compute_apps.empty()) inventory.compute_apps_file = beside(path, sim->compute_apps);
  if (!sim->utilization.empty()) inventory.utilization_file = beside(path, sim->utilization);
  return inventory;
}

Result<std::vector<ComputeApp>> read_simulated_compute_apps(const std::string& file) {
  if (file.empty()) return std::vector<ComputeApp>{};
  auto text = read_recorded_output(file);
  if (!text) return std::unexpected(text.error());
  auto apps = parse_compute_apps(*text);
  if (!apps) return std::unexpected(apps.error().with_context(file));
  // nvidia-smi lists live processes only: a recorded pid that has exited holds nothing.
  std::erase_if(*apps, [](const ComputeApp& app) { return app.pid && ::kill(*app.pid, 0) != 0 && errno == ESRCH; });
  return apps;
}

Result<std::map<int, int>> read_simulated_gpu_utilization(const std::string& file) {
  if (file.empty()) return std::map<int, int>{};
  auto text = read_recorded_output(file);
  if (!text) return std::unexpected(text.error());
  auto busy = parse_gpu_utilization(*text);
  if (!busy) return std::unexpected(busy.error().with_context(file));
  return busy;
}

}  // namespace corral::agent
