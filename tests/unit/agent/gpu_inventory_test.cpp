// read_nvidia_inventory through an injected runner that answers with recorded outputs,
// one end-to-end run through a stand-in nvidia-smi script, and the simulated loader.

#include "agent/inventory/gpu_inventory.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/agent/test_data.hpp"

namespace corral::agent {
namespace {

using test_data::read_data;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename Strings>
std::string joined(const Strings& words) {
  std::string text;
  for (const auto& word : words) {
    if (!text.empty()) text += ' ';
    text += word;
  }
  return text;
}

// Answers each command line from a table; anything else is "not found".
class FakeNvidiaSmi {
 public:
  // Answers from the recorded node folder (a missing file answers as a failure).
  explicit FakeNvidiaSmi(const std::string& node) {
    answer("nvidia-smi " + joined(kQueryGpuArgs), ok(read_data(node + "/query_gpu.csv")));
    answer("nvidia-smi", ok(read_data(node + "/nvidia_smi.txt")));
    answer("nvidia-smi " + joined(kTopoArgs), ok(read_data(node + "/topo_m.txt")));
    answer("nvidia-smi " + joined(kQueryComputeAppsArgs), ok(read_data(node + "/compute_apps.csv")));
    answer("nvidia-smi " + joined(kQueryUtilizationArgs), ok(read_data(node + "/utilization.csv")));
  }

  static Result<CommandOutput> ok(std::string out) { return CommandOutput{0, 0, std::move(out), ""}; }

  void answer(const std::string& command, Result<CommandOutput> result) {
    answers_.insert_or_assign(command, std::move(result));
  }

  CommandRunner runner() {
    return [this](const std::vector<std::string>& argv, Duration timeout) -> Result<CommandOutput> {
      calls.push_back(joined(argv));
      timeouts.push_back(timeout);
      auto it = answers_.find(joined(argv));
      if (it == answers_.end()) return make_error(ErrorCode::NotFound, "program not found: " + argv.front());
      return it->second;
    };
  }

  std::vector<std::string> calls;
  std::vector<Duration> timeouts;

 private:
  std::map<std::string, Result<CommandOutput>> answers_;
};

TEST(GpuInventory, ReadsADgxA100FromItsThreeCommands) {
  FakeNvidiaSmi smi("dgx-a100");
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_FALSE(inventory->simulated);
  EXPECT_EQ(inventory->driver, "550.54.15");
  EXPECT_EQ(inventory->cuda, (model::CudaVersion{12, 4}));
  EXPECT_TRUE(inventory->warnings.empty());
  ASSERT_EQ(inventory->gpus.size(), 8u);
  for (const auto& gpu : inventory->gpus) {
    EXPECT_EQ(gpu.nvlink_peers.size(), 7u);
    EXPECT_EQ(gpu.cls.product, "NVIDIA A100-SXM4-80GB");
  }
  EXPECT_EQ(smi.calls.size(), 3u);
}

TEST(GpuInventory, ReadsAnH200NodeOnDriver570) {
  FakeNvidiaSmi smi("hgx-h200");
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_EQ(inventory->cuda, (model::CudaVersion{12, 8}));
  ASSERT_EQ(inventory->gpus.size(), 8u);
  EXPECT_EQ(inventory->gpus[5].cls, (model::GpuClass{"NVIDIA H200", 143771, "570.133.20"}));
  EXPECT_THAT(inventory->gpus[5].nvlink_peers, ElementsAre(0, 1, 2, 3, 4, 6, 7));
}

TEST(GpuInventory, ReadsAMixedNodeWithPartialNvlink) {
  FakeNvidiaSmi smi("mixed-a100-v100");
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  ASSERT_EQ(inventory->gpus.size(), 4u);
  EXPECT_THAT(inventory->gpus[1].nvlink_peers, ElementsAre(0));
  EXPECT_TRUE(inventory->gpus[3].nvlink_peers.empty());
  EXPECT_EQ(inventory->gpus[3].cls.product, "Tesla V100-PCIE-32GB");
}

TEST(GpuInventory, TopologyFailureLeavesNvlinkUnknownButIsNotFatal) {
  FakeNvidiaSmi smi("dgx-h100-580");
  smi.answer("nvidia-smi topo -m",
             CommandOutput{3, 0, "", "Topology is not supported in this configuration\n"});
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_EQ(inventory->cuda, (model::CudaVersion{13, 0}));
  ASSERT_EQ(inventory->gpus.size(), 8u);
  for (const auto& gpu : inventory->gpus) EXPECT_TRUE(gpu.nvlink_peers.empty());
  ASSERT_EQ(inventory->warnings.size(), 1u);
  EXPECT_THAT(inventory->warnings[0], HasSubstr("NVLink unknown"));
  EXPECT_THAT(inventory->warnings[0], HasSubstr("not supported"));
}

TEST(GpuInventory, UnreadableTopologyIsAWarningToo) {
  FakeNvidiaSmi smi("dgx-a100");
  smi.answer("nvidia-smi topo -m", FakeNvidiaSmi::ok("something else entirely\n"));
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_EQ(inventory->warnings.size(), 1u);
  EXPECT_TRUE(inventory->gpus[0].nvlink_peers.empty());
}

TEST(GpuInventory, DriverNotAnsweringIsUnavailableWithNvidiaSmisOwnWords) {
  FakeNvidiaSmi smi("dgx-a100");
  const std::string said = read_data("failures/driver_not_answering.txt");
  for (const char* command : {"nvidia-smi", "nvidia-smi topo -m"})
    smi.answer(command, CommandOutput{9, 0, said, ""});
  smi.answer("nvidia-smi " + joined(kQueryGpuArgs), CommandOutput{9, 0, said, ""});
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::Unavailable);
  EXPECT_THAT(
      inventory.error().message(),
      HasSubstr(
          "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
          "the latest NVIDIA driver is installed and running."));
  EXPECT_THAT(inventory.error().message(), HasSubstr("status 9"));
}

TEST(GpuInventory, DriverLibraryMismatchIsUnavailable) {
  FakeNvidiaSmi smi("dgx-a100");
  smi.answer("nvidia-smi " + joined(kQueryGpuArgs),
             CommandOutput{18, 0, read_data("failures/nvml_version_mismatch.txt"), ""});
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::Unavailable);
  EXPECT_THAT(inventory.error().message(), HasSubstr("Driver/library version mismatch"));
}

TEST(GpuInventory, BannerFailingAfterTheQueryIsUnavailable) {
  FakeNvidiaSmi smi("dgx-a100");
  smi.answer("nvidia-smi", CommandOutput{9, 0, read_data("failures/driver_not_answering.txt"), ""});
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::Unavailable);
}

TEST(GpuInventory, MissingNvidiaSmiIsUnavailable) {
  FakeNvidiaSmi smi("dgx-a100");
  auto inventory = read_nvidia_inventory(smi.runner(), "/opt/nowhere/nvidia-smi");
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::Unavailable);
  EXPECT_THAT(inventory.error().message(), HasSubstr("/opt/nowhere/nvidia-smi"));
}

TEST(GpuInventory, PassesATimeoutOnAsTimeout) {
  FakeNvidiaSmi smi("dgx-a100");
  smi.answer("nvidia-smi " + joined(kQueryGpuArgs), make_error(ErrorCode::Timeout, "did not finish"));
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::Timeout);
}

TEST(GpuInventory, MalformedQueryOutputIsInvalidArgument) {
  FakeNvidiaSmi smi("dgx-a100");
  smi.answer("nvidia-smi " + joined(kQueryGpuArgs),
             FakeNvidiaSmi::ok("0, GPU-a, [N/A], 81920, 550.54.15, x\n"));
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(inventory.error().message(), HasSubstr("name"));
}

TEST(GpuInventory, NoGpusListedIsUnavailable) {
  FakeNvidiaSmi smi("dgx-a100");
  smi.answer("nvidia-smi " + joined(kQueryGpuArgs), FakeNvidiaSmi::ok(""));
  auto inventory = read_nvidia_inventory(smi.runner());
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::Unavailable);
}

TEST(GpuInventory, RunsTheGivenNvidiaSmiWithTheGivenTimeout) {
  FakeNvidiaSmi smi("dgx-a100");
  auto inventory = read_nvidia_inventory(smi.runner(), "/usr/bin/nvidia-smi", Duration(1234));
  ASSERT_FALSE(inventory.has_value());  // the table answers "nvidia-smi" only
  ASSERT_EQ(smi.calls.size(), 1u);
  EXPECT_EQ(smi.calls[0], "/usr/bin/nvidia-smi " + joined(kQueryGpuArgs));
  EXPECT_EQ(smi.timeouts[0], Duration(1234));
}

TEST(GpuInventory, ReadsComputeApps) {
  FakeNvidiaSmi smi("hgx-h200");
  auto apps = read_compute_apps(smi.runner());
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  ASSERT_EQ(apps->size(), 2u);
  EXPECT_EQ((*apps)[1].pid, 1843022);
}

TEST(GpuInventory, ComputeAppsFailWhenTheDriverIsNotAnswering) {
  FakeNvidiaSmi smi("hgx-h200");
  smi.answer("nvidia-smi " + joined(kQueryComputeAppsArgs),
             CommandOutput{9, 0, read_data("failures/driver_not_answering.txt"), ""});
  auto apps = read_compute_apps(smi.runner());
  ASSERT_FALSE(apps.has_value());
  EXPECT_EQ(apps.error().code(), ErrorCode::Unavailable);
}

TEST(GpuInventory, ReadsUtilizationAndFailsWhenTheDriverIsNotAnswering) {
  FakeNvidiaSmi smi("hgx-h200");
  auto busy = read_gpu_utilization(smi.runner(), "nvidia-smi", Duration(2000));
  ASSERT_TRUE(busy.has_value()) << busy.error().message();
  EXPECT_EQ(busy->at(1), 97);
  EXPECT_EQ(smi.timeouts.back(), Duration(2000));
  smi.answer("nvidia-smi " + joined(kQueryUtilizationArgs),
             CommandOutput{9, 0, read_data("failures/driver_not_answering.txt"), ""});
  auto down = read_gpu_utilization(smi.runner());
  ASSERT_FALSE(down.has_value());
  EXPECT_EQ(down.error().code(), ErrorCode::Unavailable);
}

// The whole path with real processes: a shell script stands in for nvidia-smi.
TEST(GpuInventory, ReadsAnInventoryThroughRealProcesses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("corral-fake-smi-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path script = dir / "nvidia-smi";
  const std::string data = (test_data::data_dir() / "dgx-a100").string();
  {
    std::ofstream out(script);
    out << "#!/bin/sh\n"
        << "case \"$1\" in\n"
        << "  --query-gpu=*) exec cat '" << data << "/query_gpu.csv' ;;\n"
        << "  topo) exec cat '" << data << "/topo_m.txt' ;;\n"
        << "  '') exec cat '" << data << "/nvidia_smi.txt' ;;\n"
        << "  *) echo \"unexpected: $*\" >&2; exit 2 ;;\n"
        << "esac\n";
  }
  fs::permissions(script, fs::perms::owner_all);
  auto inventory = read_nvidia_inventory(system_command_runner(), script.string(), Duration(10'000));
  fs::remove_all(dir);
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_EQ(inventory->gpus.size(), 8u);
  EXPECT_EQ(inventory->gpus[7].nvlink_peers.size(), 7u);
  EXPECT_TRUE(inventory->warnings.empty());
}

TEST(GpuInventory, LoadsASimulatedInventoryFileAsSimulated) {
  auto inventory = read_simulated_inventory(std::string(CORRAL_SOURCE_DIR) + "/configs/sim/a100x8.yaml");
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_TRUE(inventory->simulated);
  EXPECT_EQ(inventory->driver, "550.54.15");
  EXPECT_EQ(inventory->cuda, (model::CudaVersion{12, 4}));
  EXPECT_EQ(inventory->gpus.size(), 8u);
}

TEST(GpuInventory, SimulatedUuidsDifferFromNodeToNode) {
  std::string file = std::string(CORRAL_SOURCE_DIR) + "/configs/sim/a100x8.yaml";
  auto a = read_simulated_inventory(file, "gpu-a");
  auto b = read_simulated_inventory(file, "gpu-b");
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->gpus[0].uuid, b->gpus[0].uuid);
  EXPECT_NE(a->gpus[0].uuid, a->gpus[1].uuid);
  EXPECT_EQ(a->gpus[0].uuid.size(), b->gpus[0].uuid.size());
  EXPECT_TRUE(a->gpus[0].uuid.starts_with("GPU-sim-"));
  EXPECT_EQ(a->gpus[0].uuid, read_simulated_inventory(file, "gpu-a")->gpus[0].uuid);  // stable across restarts
}

TEST(GpuInventory, ASimulatedNodesLiveComputeProcessesComeFromItsFileReadAnewEachTime) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("corral-sim-apps-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "sim.yaml") << "driver: \"550.54.15\"\ncuda: \"12.4\"\ncompute_apps: apps.csv\n"
                                     "gpus: [{name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2}]\n";
  auto inventory = read_simulated_inventory((dir / "sim.yaml").string(), "gpu-a");
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_EQ(inventory->compute_apps_file, (dir / "apps.csv").string()) << "relative to the inventory";
  auto none = read_simulated_compute_apps(inventory->compute_apps_file);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty()) << "no file yet: no process on a GPU";
  // A live process (this one), one that has exited (a reaped child), and one nvidia-smi
  // will not name: the exited one is not listed, as nvidia-smi would not list it.
  pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  std::ofstream(dir / "apps.csv") << ::getpid() << ", " << inventory->gpus[0].uuid << ", 1024\n"
                                  << gone << ", " << inventory->gpus[1].uuid << ", 1024\n"
                                  << "[N/A], " << inventory->gpus[1].uuid << ", [N/A]\n";
  auto one = read_simulated_compute_apps(inventory->compute_apps_file);
  ASSERT_TRUE(one.has_value()) << one.error().message();
  ASSERT_EQ(one->size(), 2u);
  EXPECT_EQ((*one)[0].pid, ::getpid());
  EXPECT_FALSE((*one)[1].pid.has_value());
  std::ofstream(dir / "apps.csv") << "812, GPU-x\n";
  auto bad = read_simulated_compute_apps(inventory->compute_apps_file);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("apps.csv"), std::string::npos) << bad.error().message();
  fs::remove_all(dir);
}

TEST(GpuInventory, ASimulatedNodesUtilizationComesFromItsFileReadAnewEachTime) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("corral-sim-busy-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "sim.yaml")
      << "driver: \"550.54.15\"\ncuda: \"12.4\"\nutilization: busy.csv\n"
         "gpus: [{name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2}]\n";
  auto inventory = read_simulated_inventory((dir / "sim.yaml").string(), "gpu-a");
  ASSERT_TRUE(inventory.has_value()) << inventory.error().message();
  EXPECT_EQ(inventory->utilization_file, (dir / "busy.csv").string()) << "relative to the inventory";
  EXPECT_TRUE(inventory->compute_apps_file.empty());
  auto none = read_simulated_gpu_utilization(inventory->utilization_file);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty()) << "no file yet: nothing known";
  std::ofstream(dir / "busy.csv") << "0, 0\n1, 88\n";
  auto two = read_simulated_gpu_utilization(inventory->utilization_file);
  ASSERT_TRUE(two.has_value()) << two.error().message();
  EXPECT_EQ(*two, (std::map<int, int>{{0, 0}, {1, 88}}));
  std::ofstream(dir / "busy.csv") << "0, busy\n";
  auto bad = read_simulated_gpu_utilization(inventory->utilization_file);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("busy.csv"), std::string::npos) << bad.error().message();
  fs::remove_all(dir);
}

TEST(GpuInventory, MissingSimulatedInventoryFileIsNotFound) {
  auto inventory = read_simulated_inventory("/nonexistent/sim.yaml");
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::NotFound);
}

TEST(GpuInventory, EndlessSimulatedInventoryFileIsRejectedNotRead) {
  auto inventory = read_simulated_inventory("/dev/zero");
  ASSERT_FALSE(inventory.has_value());
  EXPECT_EQ(inventory.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(inventory.error().message(), HasSubstr("limit"));
}

}  // namespace
}  // namespace corral::agent
