// corral-agent --config agent.yaml

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>

#include "agent/agent.hpp"
#include "agent/inventory/gpu_inventory.hpp"
#include "common/core/version.hpp"
#include "common/model/config.hpp"
#include "common/net/pki.hpp"
#include "worker/exit_codes.hpp"

using namespace corral;

namespace {

int fail(const std::string& message, int code = 1) {
  std::cerr << "corral-agent: " << message << "\n";
  return code;
}

// The kernel hands out ephemeral ports from this range; a master port inside it can be
// taken by any outgoing connection between the probe and the job's bind.
void warn_ephemeral_overlap(const model::PortRange& ports) {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0;
  int hi = 0;
  if (!(in >> lo >> hi)) return;
  if (ports.first <= hi && lo <= ports.last) {
    spdlog::warn("ports {}-{} overlap the kernel's ephemeral range {}-{} "
                 "(/proc/sys/net/ipv4/ip_local_port_range): a master port may be taken by an outgoing connection",
                 ports.first, ports.last, lo, hi);
  }
}

// The node checklist: nvidia-smi answers, each GPU found at start is listed with its
// driver and CUDA version, and (when corral-worker was built with CUDA) a kernel runs on
// every GPU.
std::string preflight(const model::AgentConfig& config, std::size_t expected_gpus) {
  auto run = agent::system_command_runner();
  auto inv = agent::read_nvidia_inventory(run, config.nvidia_smi);
  if (!inv) return inv.error().message();
  if (inv->gpus.size() != expected_gpus) {
    return "nvidia-smi lists " + std::to_string(inv->gpus.size()) + " GPUs, " + std::to_string(expected_gpus) +
           " at start";
  }
  auto worker = run({config.worker, "preflight"}, std::chrono::minutes(2));
  if (!worker) return "corral-worker preflight: " + worker->err + worker.error().message();
  // Built without CUDA/NCCL: the kernel check cannot run here; nvidia-smi's view stands.
  if (worker->exit_code == worker::to_int(worker::ExitCode::GpuSupportNotBuilt)) return "";
  if (worker->exit_code != 0) {
    std::string why = worker->err.empty() ? worker->out : worker->err;
    if (auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
    return "corral-worker preflight failed (exit " + std::to_string(worker->exit_code) + "): " + why;
  }
  return "";
}

// A real node's GPUs from nvidia-smi, then the first preflight: run by the agent off its
// loop before it joins. A node whose nvidia-smi fails joins all the same, drained with
// the reason, so `corral nodes` shows what is wrong.
protocol::Hello survey(const model::AgentConfig& config, protocol::Hello node) {
  auto inv = agent::read_nvidia_inventory(agent::system_command_runner(), config.nvidia_smi);
  if (!inv) {
    node.health_error = inv.error().message();
  } else {
    for (const auto& w : inv->warnings) spdlog::warn("{}", w);
    spdlog::info("nvidia-smi: {} GPU(s), driver {}, CUDA {}", inv->gpus.size(), inv->driver, inv->cuda.to_string());
    node.simulated = inv->simulated;
    node.driver = inv->driver;
    node.cuda = inv->cuda;
    node.gpus = inv->gpus;
    node.health_error = preflight(config, inv->gpus.size());
  }
  if (!node.health_error.empty()) spdlog::error("preflight failed: {}", node.health_error);
  return node;
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr (journald under systemd); stdout is for what a command prints.
  spdlog::set_default_logger(spdlog::stderr_color_mt("corral"));
  CLI::App app{"corral-agent: runs a node's ranks for the corral coordinator"};
  app.set_version_flag("--version", corral::version_line("corral-agent"));
  std::string config_path;
  app.add_option("--config", config_path, "agent.yaml")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto config = model::load_agent_config(config_path);
  if (!config) return fail(config.error().message(), 2);
  auto cn = net::certificate_common_name(config->cert);
  if (!cn) return fail(cn.error().message(), 2);
  if (*cn != config->node) {
    return fail("node is " + config->node + " but the certificate " + config->cert + " is for " + *cn, 2);
  }
  warn_ephemeral_overlap(config->ports);

  protocol::Hello hello;
  hello.node = config->node;
  hello.address = config->advertise;
  hello.ports = config->ports;
  agent::AgentHooks hooks;
  if (!config->simulate.empty()) {
    // A file of the operator's, read at once: a bad one stops the agent with its reason.
    auto inv = agent::read_simulated_inventory(config->simulate, config->node);
    if (!inv) return fail(inv.error().message(), 2);
    spdlog::info("simulated inventory from {}: {} GPU(s)", config->simulate, inv->gpus.size());
    hello.simulated = true;
    hello.driver = inv->driver;
    hello.cuda = inv->cuda;
    hello.gpus = inv->gpus;
    hooks.compute_apps = [file = inv->compute_apps_file] { return agent::read_simulated_compute_apps(file); };
    if (!inv->utilization_file.empty()) {
      hooks.gpu_utilization = [file = inv->utilization_file] {
        return agent::read_simulated_gpu_utilization(file);
      };
    }
  } else {
    hooks.survey = [c = *config](protocol::Hello node) { return survey(c, std::move(node)); };
    hooks.compute_apps = [c = *config] {
      return agent::read_compute_apps(agent::system_command_runner(), c.nvidia_smi);
    };
    hooks.gpu_utilization = [c = *config] {
      return agent::read_gpu_utilization(agent::system_command_runner(), c.nvidia_smi);
    };
    hooks.preflight = [c = *config](std::size_t expected) { return preflight(c, expected); };
  }
  net::EventLoop loop;
  agent::Agent agent(loop, *config, hello, hooks);
  if (auto r = agent.start(); !r) return fail(r.error().message());
  spdlog::info("corral-agent {} started: advertising {}, ports {}-{}, spool {}", config->node, config->advertise,
               config->ports.first, config->ports.last, config->spool);
  loop.on_shutdown_signal([&](int sig) {
    // Ranks are not waited for: the coordinator places nothing here after node_timeout
    // and loses this node after node_lost_timeout, and an agent started again kills what
    // this one left (its spool lists them).
    spdlog::info("signal {}: stopping", sig);
    agent.stop();
    loop.stop();
  });
  loop.run();
  return 0;
}
