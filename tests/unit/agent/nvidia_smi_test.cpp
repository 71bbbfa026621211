// The nvidia-smi parsers on outputs in the exact layout real drivers print.

#include "agent/inventory/nvidia_smi.hpp"

#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/agent/test_data.hpp"

namespace corral::agent {
namespace {

using test_data::read_data;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int> all_but(int self, int n) {
  std::vector<int> peers;
  for (int i = 0; i < n; ++i) {
    if (i != self) peers.push_back(i);
  }
  return peers;
}

// ------------------------------------------------------------------ --query-gpu

TEST(NvidiaSmi, ReadsOneRowPerGpuFromDgxA100QueryGpu) {
  auto rows = parse_query_gpu(read_data("dgx-a100/query_gpu.csv"));
  ASSERT_TRUE(rows.has_value()) << rows.error().message();
  ASSERT_EQ(rows->size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const GpuRow& row = (*rows)[static_cast<std::size_t>(i)];
    EXPECT_EQ(row.index, i);
    EXPECT_EQ(row.name, "NVIDIA A100-SXM4-80GB");
    EXPECT_EQ(row.memory_mib, 81920);
    EXPECT_EQ(row.driver, "550.54.15");
    EXPECT_THAT(row.uuid, ::testing::StartsWith("GPU-"));
  }
  EXPECT_EQ((*rows)[0].pci_bus_id, "00000000:07:00.0");
  EXPECT_EQ((*rows)[7].pci_bus_id, "00000000:BD:00.0");
}

TEST(NvidiaSmi, ReadsTheSingleGpuOfAnRtx4090Workstation) {
  auto rows = parse_query_gpu(read_data("rtx4090-workstation/query_gpu.csv"));
  ASSERT_TRUE(rows.has_value()) << rows.error().message();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ(rows->front().name, "NVIDIA GeForce RTX 4090");
  EXPECT_EQ(rows->front().memory_mib, 24564);
  EXPECT_EQ(rows->front().pci_bus_id, "00000000:01:00.0");
}

TEST(NvidiaSmi, ToleratesCrlfLineEndsInQueryGpu) {
  const std::string csv = read_data("mixed-a100-v100/query_gpu.csv");
  ASSERT_NE(csv.find("\r\n"), std::string::npos);
  auto rows = parse_query_gpu(csv);
  ASSERT_TRUE(rows.has_value()) << rows.error().message();
  ASSERT_EQ(rows->size(), 4u);
  EXPECT_EQ((*rows)[3].pci_bus_id, "00000000:CA:00.0");
  EXPECT_EQ((*rows)[2].name, "Tesla V100-PCIE-32GB");
}

TEST(NvidiaSmi, ToleratesMissingSpacesAndBlankLinesInQueryGpu) {
  auto rows = parse_query_gpu(
      "0,GPU-a,NVIDIA L4,23034,550.54.15,00000000:01:00.0\n\n  1 ,  GPU-b , NVIDIA L4 ,23034, "
      "550.54.15 ,00000000:02:00.0  \n\n");
  ASSERT_TRUE(rows.has_value()) << rows.error().message();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1], (GpuRow{1, "GPU-b", "NVIDIA L4", 23034, "550.54.15", "00000000:02:00.0"}));
}

TEST(NvidiaSmi, ReadsEmptyQueryGpuOutputAsNoGpus) {
  auto rows = parse_query_gpu("");
  ASSERT_TRUE(rows.has_value());
  EXPECT_TRUE(rows->empty());
}

TEST(NvidiaSmi, RejectsNotAvailableInARequiredFieldNamingLineAndField) {
  auto rows = parse_query_gpu(
      "0, GPU-a, NVIDIA A100-SXM4-80GB, 81920, 550.54.15, 00000000:07:00.0\n"
      "1, GPU-b, NVIDIA A100-SXM4-80GB, [N/A], 550.54.15, 00000000:0F:00.0\n");
  ASSERT_FALSE(rows.has_value());
  EXPECT_EQ(rows.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(rows.error().message(), HasSubstr("line 2"));
  EXPECT_THAT(rows.error().message(), HasSubstr("memory.total"));
  EXPECT_THAT(rows.error().message(), HasSubstr("[N/A]"));
}

TEST(NvidiaSmi, RejectsNotSupportedInARequiredField) {
  auto rows = parse_query_gpu("0, GPU-a, NVIDIA A100-SXM4-80GB, 81920, 550.54.15, [Not Supported]\n");
  ASSERT_FALSE(rows.has_value());
  EXPECT_THAT(rows.error().message(), HasSubstr("pci.bus_id"));
  EXPECT_THAT(rows.error().message(), HasSubstr("[Not Supported]"));
}

TEST(NvidiaSmi, RejectsAQueryGpuLineWithTheWrongNumberOfFields) {
  auto rows = parse_query_gpu("0, GPU-a, NVIDIA A100-SXM4-80GB, 81920, 550.54.15\n");
  ASSERT_FALSE(rows.has_value());
  EXPECT_EQ(rows.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(rows.error().message(), HasSubstr("line 1"));
  EXPECT_THAT(rows.error().message(), HasSubstr("expected 6 fields"));
}

TEST(NvidiaSmi, RejectsQueryGpuOutputWithUnitsLeftIn) {
  auto rows = parse_query_gpu("0, GPU-a, NVIDIA A100-SXM4-80GB, 81920 MiB, 550.54.15, 00000000:07:00.0\n");
  ASSERT_FALSE(rows.has_value());
  EXPECT_THAT(rows.error().message(), HasSubstr("memory.total"));
}

TEST(NvidiaSmi, RejectsAQueryGpuHeaderLine) {
  auto rows = parse_query_gpu("index, uuid, name, memory.total [MiB], driver_version, pci.bus_id\n");
  ASSERT_FALSE(rows.has_value());
  EXPECT_THAT(rows.error().message(), HasSubstr("index"));
}

TEST(NvidiaSmi, RejectsAGpuIndexOrUuidListedTwice) {
  auto twice_index = parse_query_gpu(
      "0, GPU-a, X, 1, 550.54.15, 00000000:01:00.0\n0, GPU-b, X, 1, 550.54.15, 00000000:02:00.0\n");
  ASSERT_FALSE(twice_index.has_value());
  EXPECT_THAT(twice_index.error().message(), HasSubstr("listed twice"));
  auto twice_uuid = parse_query_gpu(
      "0, GPU-a, X, 1, 550.54.15, 00000000:01:00.0\n1, GPU-a, X, 1, 550.54.15, 00000000:02:00.0\n");
  ASSERT_FALSE(twice_uuid.has_value());
  EXPECT_THAT(twice_uuid.error().message(), HasSubstr("line 2"));
}

TEST(NvidiaSmi, RejectsADeviceHandleErrorAmongQueryGpuRows) {
  // A GPU that fell off the bus: nvidia-smi prints this instead of its row.
  auto rows = parse_query_gpu(
      "0, GPU-a, NVIDIA A100-SXM4-80GB, 81920, 550.54.15, 00000000:07:00.0\n"
      "Unable to determine the device handle for GPU0000:0F:00.0: Unknown Error\n");
  ASSERT_FALSE(rows.has_value());
  EXPECT_THAT(rows.error().message(), HasSubstr("line 2"));
  EXPECT_THAT(rows.error().message(), HasSubstr("Unable to determine the device handle"));
}

// ------------------------------------------------------------------ banner

TEST(NvidiaSmi, ReadsCudaVersionFromA550Banner) {
  auto cuda = parse_cuda_version(read_data("rtx4090-workstation/nvidia_smi.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{12, 4}));
}

TEST(NvidiaSmi, ReadsCudaVersionFromTheNarrower535Banner) {
  auto cuda = parse_cuda_version(read_data("mixed-a100-v100/nvidia_smi.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{12, 2}));
}

TEST(NvidiaSmi, ReadsCuda128FromA570Banner) {
  auto cuda = parse_cuda_version(read_data("hgx-h200/nvidia_smi.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{12, 8}));
}

TEST(NvidiaSmi, ReadsCuda130FromA580Banner) {
  auto cuda = parse_cuda_version(read_data("dgx-h100-580/nvidia_smi.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{13, 0}));
  EXPECT_GT(*cuda, (model::CudaVersion{12, 9}));
}

TEST(NvidiaSmi, ReadsCudaVersionFromTheHeaderLineAlone) {
  auto cuda = parse_cuda_version("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |");
  ASSERT_TRUE(cuda.has_value());
  EXPECT_EQ(*cuda, (model::CudaVersion{12, 4}));
}

TEST(NvidiaSmi, ReadsTheDriverVersionFromTheBanner) {
  EXPECT_EQ(parse_banner_driver(read_data("hgx-h200/nvidia_smi.txt")).value_or(""), "570.133.20");
  EXPECT_EQ(parse_banner_driver(read_data("mixed-a100-v100/nvidia_smi.txt")).value_or(""), "535.104.05");
}

TEST(NvidiaSmi, ReadsTheRenamedKmdAndCudaUmdLabelsOf610Drivers) {
  auto cuda = parse_cuda_version(read_data("b200-610/nvidia_smi.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{13, 3}));
  EXPECT_EQ(parse_banner_driver(read_data("b200-610/nvidia_smi.txt")).value_or(""), "610.43.02");
  auto windows = parse_cuda_version(read_data("banners/windows-610-kmd-umd.txt"));
  ASSERT_TRUE(windows.has_value()) << windows.error().message();
  EXPECT_EQ(*windows, (model::CudaVersion{13, 3}));
  EXPECT_EQ(parse_banner_driver(read_data("banners/windows-610-kmd-umd.txt")).value_or(""), "610.62");
}

TEST(NvidiaSmi, ReadsTheNarrow79ColumnBannerOfOlderDrivers) {
  auto cuda = parse_cuda_version(read_data("banners/470-narrow.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{11, 4}));
  EXPECT_EQ(parse_banner_driver(read_data("banners/470-narrow.txt")).value_or(""), "470.63.01");
}

TEST(NvidiaSmi, ReadsTheDriverVersionNotTheNvidiaSmiVersionUnderWsl) {
  EXPECT_EQ(parse_banner_driver(read_data("banners/wsl-530-driver-531.txt")).value_or(""), "531.68");
  auto cuda = parse_cuda_version(read_data("banners/wsl-530-driver-531.txt"));
  ASSERT_TRUE(cuda.has_value()) << cuda.error().message();
  EXPECT_EQ(*cuda, (model::CudaVersion{12, 1}));
}

TEST(NvidiaSmi, RejectsABannerFromADriverOlderThanCudaVersionReporting) {
  auto cuda = parse_cuda_version(read_data("banners/331-no-cuda.txt"));
  ASSERT_FALSE(cuda.has_value());
  EXPECT_EQ(cuda.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(cuda.error().message(), HasSubstr("before 410"));
  EXPECT_EQ(parse_banner_driver(read_data("banners/331-no-cuda.txt")).value_or(""), "331.62");
}

TEST(NvidiaSmi, ReportsCudaVersionNotFoundAsUnavailable) {
  auto cuda =
      parse_cuda_version("| NVIDIA-SMI 580.105.06   Driver Version: 580.105.06   CUDA Version: Not Found |");
  ASSERT_FALSE(cuda.has_value());
  EXPECT_EQ(cuda.error().code(), ErrorCode::Unavailable);
  EXPECT_THAT(cuda.error().message(), HasSubstr("Not Found"));
}

TEST(NvidiaSmi, ReportsCudaVersionNotAvailableAsUnavailable) {
  auto cuda =
      parse_cuda_version("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: N/A      |");
  ASSERT_FALSE(cuda.has_value());
  EXPECT_EQ(cuda.error().code(), ErrorCode::Unavailable);
}

TEST(NvidiaSmi, ReportsADriverNotAnsweringBannerAsUnavailableWithItsText) {
  auto cuda = parse_cuda_version(read_data("failures/driver_not_answering.txt"));
  ASSERT_FALSE(cuda.has_value());
  EXPECT_EQ(cuda.error().code(), ErrorCode::Unavailable);
  EXPECT_THAT(cuda.error().message(), HasSubstr("couldn't communicate with the NVIDIA driver"));
}

TEST(NvidiaSmi, RejectsABannerWithoutACudaVersion) {
  auto cuda = parse_cuda_version("Usage: nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...\n");
  ASSERT_FALSE(cuda.has_value());
  EXPECT_EQ(cuda.error().code(), ErrorCode::InvalidArgument);
}

TEST(NvidiaSmi, RejectsACudaVersionThatIsNotMajorDotMinor) {
  auto cuda =
      parse_cuda_version("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: twelve |");
  ASSERT_FALSE(cuda.has_value());
  EXPECT_EQ(cuda.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(cuda.error().message(), HasSubstr("twelve"));
}

// ------------------------------------------------------------------ topo -m

TEST(NvidiaSmi, ReadsNvlinkPeersFromDgxA100Topology) {
  auto peers = parse_topo_nvlink(read_data("dgx-a100/topo_m.txt"));
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  ASSERT_EQ(peers->size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(peers->at(i), all_but(i, 8)) << "GPU" << i;
}

TEST(NvidiaSmi, SkipsNicRowsAndColumnsInTopology) {
  auto peers = parse_topo_nvlink(read_data("dgx-a100/topo_m.txt"));
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  std::set<int> gpus;
  for (const auto& [gpu, list] : *peers) {
    gpus.insert(gpu);
    for (int peer : list) EXPECT_LT(peer, 8);  // a NIC column would read as a peer >= 8
  }
  EXPECT_EQ(gpus, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(NvidiaSmi, ReadsPartialNvlinkOnAMixedNode) {
  auto peers = parse_topo_nvlink(read_data("mixed-a100-v100/topo_m.txt"));
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  EXPECT_THAT(peers->at(0), ElementsAre(1));
  EXPECT_THAT(peers->at(1), ElementsAre(0));
  EXPECT_TRUE(peers->at(2).empty());
  EXPECT_TRUE(peers->at(3).empty());
}

TEST(NvidiaSmi, ReadsATopologyWhoseHeaderIsUnderlined) {
  const std::string text = read_data("hgx-h200/topo_m.txt");
  ASSERT_NE(text.find("\x1b[4m"), std::string::npos);
  auto peers = parse_topo_nvlink(text);
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  ASSERT_EQ(peers->size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(peers->at(i), all_but(i, 8)) << "GPU" << i;
}

TEST(NvidiaSmi, ReadsASingleGpuTopologyAsNoPeers) {
  auto peers = parse_topo_nvlink(read_data("rtx4090-workstation/topo_m.txt"));
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  ASSERT_EQ(peers->size(), 1u);
  EXPECT_TRUE(peers->at(0).empty());
}

TEST(NvidiaSmi, ReadsASpaceAlignedTopologyWithOldStyleNicNames) {
  // Older drivers name NIC columns after the device and have no NUMA columns.
  auto peers = parse_topo_nvlink(
      "        GPU0    GPU1    GPU2    GPU3    mlx5_0  CPU Affinity\n"
      "GPU0     X      NV1     NV1     NV2     SYS     0-15\n"
      "GPU1    NV1      X      NV2     NV1     SYS     0-15\n"
      "GPU2    NV1     NV2      X      SOC     SYS     0-15\n"
      "GPU3    NV2     NV1     SOC      X      SYS     0-15\n"
      "mlx5_0  SYS     SYS     SYS     SYS      X \n"
      "\n"
      "Legend:\n"
      "\n"
      "  X    = Self\n"
      "  NV#  = Connection traversing a bonded set of # NVLinks\n");
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  EXPECT_THAT(peers->at(0), ElementsAre(1, 2, 3));
  EXPECT_THAT(peers->at(2), ElementsAre(0, 1));
  EXPECT_THAT(peers->at(3), ElementsAre(0, 1));
}

TEST(NvidiaSmi, ReadsAnOldPcieTopologyWithSocCellsAndABareNicRow) {
  auto peers = parse_topo_nvlink(read_data("p40-pcie-soc/topo_m.txt"));
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  ASSERT_EQ(peers->size(), 8u);
  for (const auto& [gpu, nvlink] : *peers) EXPECT_TRUE(nvlink.empty()) << "GPU" << gpu;
}

TEST(NvidiaSmi, ReadsAWindowsTopologyWithEmptyAffinityCells) {
  auto peers = parse_topo_nvlink(read_data("windows-rtx2080s-610/topo_m.txt"));
  ASSERT_TRUE(peers.has_value()) << peers.error().message();
  ASSERT_EQ(peers->size(), 1u);
  EXPECT_TRUE(peers->at(0).empty());
}

TEST(NvidiaSmi, RejectsATopologyWithoutAMatrixHeader) {
  auto peers = parse_topo_nvlink(read_data("failures/driver_not_answering.txt"));
  ASSERT_FALSE(peers.has_value());
  EXPECT_EQ(peers.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(peers.error().message(), HasSubstr("no matrix header"));
}

TEST(NvidiaSmi, RejectsATopologyRowShorterThanTheHeader) {
  auto peers = parse_topo_nvlink("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\n");
  ASSERT_FALSE(peers.has_value());
  EXPECT_THAT(peers.error().message(), HasSubstr("line 3"));
  EXPECT_THAT(peers.error().message(), HasSubstr("GPU1"));
}

TEST(NvidiaSmi, RejectsATopologyGpuColumnWithoutARow) {
  auto peers = parse_topo_nvlink("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\n\nLegend:\n");
  ASSERT_FALSE(peers.has_value());
  EXPECT_THAT(peers.error().message(), HasSubstr("GPU1"));
}

TEST(NvidiaSmi, RejectsATopologyWhoseDiagonalIsNotX) {
  auto peers = parse_topo_nvlink("\tGPU0\tGPU1\tCPU Affinity\nGPU0\tNV4\tNV4\t0-7\nGPU1\tNV4\t X \t0-7\n");
  ASSERT_FALSE(peers.has_value());
  EXPECT_THAT(peers.error().message(), HasSubstr("line 2"));
}

// ------------------------------------------------------------------ --query-compute-apps

TEST(NvidiaSmi, ReadsComputeAppsWithTheirGpuAndMemory) {
  auto apps = parse_compute_apps(read_data("hgx-h200/compute_apps.csv"));
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  ASSERT_EQ(apps->size(), 2u);
  EXPECT_EQ((*apps)[0].pid, 1843021);
  EXPECT_EQ((*apps)[0].used_memory_mib, 70302);
  auto rows = parse_query_gpu(read_data("hgx-h200/query_gpu.csv"));
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ((*apps)[0].gpu_uuid, (*rows)[0].uuid);
  EXPECT_EQ((*apps)[1].gpu_uuid, (*rows)[1].uuid);
}

TEST(NvidiaSmi, ReadsEmptyComputeAppsOutputAsNoProcesses) {
  auto apps = parse_compute_apps(read_data("mixed-a100-v100/compute_apps.csv"));
  ASSERT_TRUE(apps.has_value());
  EXPECT_TRUE(apps->empty());
  auto worded = parse_compute_apps("No running processes found\n");
  ASSERT_TRUE(worded.has_value());
  EXPECT_TRUE(worded->empty());
}

TEST(NvidiaSmi, LeavesComputeAppMemoryUnknownWhenTheDriverWillNotSay) {
  auto apps = parse_compute_apps("4242, GPU-a, [N/A]\n");
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  ASSERT_EQ(apps->size(), 1u);
  EXPECT_EQ((*apps)[0], (ComputeApp{4242, "GPU-a", std::nullopt}));
}

TEST(NvidiaSmi, KeepsAComputeAppWhoseProcessTheDriverWillNotName) {
  // MIG in a container: the GPU is held by a process outside it.
  auto apps =
      parse_compute_apps("4242, GPU-a, 10\n[Insufficient Permissions], GPU-b, [Insufficient Permissions]\n");
  ASSERT_TRUE(apps.has_value()) << apps.error().message();
  ASSERT_EQ(apps->size(), 2u);
  EXPECT_EQ((*apps)[1], (ComputeApp{std::nullopt, "GPU-b", std::nullopt}));
}

TEST(NvidiaSmi, RejectsAComputeAppWhosePidIsNotANumber) {
  auto apps = parse_compute_apps("4242, GPU-a, 10\npython, GPU-b, 10\n");
  ASSERT_FALSE(apps.has_value());
  EXPECT_THAT(apps.error().message(), HasSubstr("line 2"));
  EXPECT_THAT(apps.error().message(), HasSubstr("pid"));
}

// ------------------------------------------------------------------ utilization.gpu

TEST(NvidiaSmi, ReadsEachGpusUtilizationByIndex) {
  // The same node's plain nvidia-smi shows 97 % on GPUs 0 and 1 (its two compute
  // processes) and 0 % on the rest.
  auto busy = parse_gpu_utilization(read_data("hgx-h200/utilization.csv"));
  ASSERT_TRUE(busy.has_value()) << busy.error().message();
  ASSERT_EQ(busy->size(), 8u);
  EXPECT_EQ(busy->at(0), 97);
  EXPECT_EQ(busy->at(1), 97);
  EXPECT_EQ(busy->at(7), 0);
  auto one = parse_gpu_utilization(read_data("rtx4090-workstation/utilization.csv"));
  ASSERT_TRUE(one.has_value()) << one.error().message();
  EXPECT_EQ(*one, (std::map<int, int>{{0, 2}}));
}

TEST(NvidiaSmi, LeavesOutAGpuWhoseUtilizationTheDriverWillNotGive) {
  // MIG: the physical GPU's utilization reads [N/A]; unknown is not idle.
  auto busy = parse_gpu_utilization("0, [N/A]\r\n1, 40\r\n");
  ASSERT_TRUE(busy.has_value()) << busy.error().message();
  EXPECT_EQ(*busy, (std::map<int, int>{{1, 40}}));
}

TEST(NvidiaSmi, RejectsUtilizationOutputItCannotRead) {
  struct Case {
    std::string csv, says;
  };
  for (const auto& c : std::vector<Case>{{"0, 50\n1\n", "line 2"},
                                         {"0, 50\nx, 5\n", "index"},
                                         {"0, 150\n", "utilization.gpu"},
                                         {"0, -1\n", "utilization.gpu"},
                                         {"0, 5 %\n", "utilization.gpu"},
                                         {"0, 5\n0, 6\n", "listed twice"}}) {
    auto busy = parse_gpu_utilization(c.csv);
    ASSERT_FALSE(busy.has_value()) << c.csv;
    EXPECT_THAT(busy.error().message(), HasSubstr(c.says)) << c.csv;
  }
}

// ------------------------------------------------------------------ assemble

TEST(NvidiaSmi, AssemblesGpuClassCudaAndNvlinkPeersForDgxA100) {
  auto rows = parse_query_gpu(read_data("dgx-a100/query_gpu.csv"));
  auto cuda = parse_cuda_version(read_data("dgx-a100/nvidia_smi.txt"));
  auto nvlink = parse_topo_nvlink(read_data("dgx-a100/topo_m.txt"));
  ASSERT_TRUE(rows && cuda && nvlink);
  auto gpus = assemble_gpus(*rows, *cuda, *nvlink);
  ASSERT_TRUE(gpus.has_value()) << gpus.error().message();
  ASSERT_EQ(gpus->size(), 8u);
  const model::Gpu& gpu3 = (*gpus)[3];
  EXPECT_EQ(gpu3.index, 3);
  EXPECT_EQ(gpu3.uuid, (*rows)[3].uuid);
  EXPECT_EQ(gpu3.pci_bus_id, "00000000:4E:00.0");
  EXPECT_EQ(gpu3.cls, (model::GpuClass{"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"}));
  EXPECT_EQ(gpu3.cuda, (model::CudaVersion{12, 4}));
  EXPECT_THAT(gpu3.nvlink_peers, ElementsAre(0, 1, 2, 4, 5, 6, 7));
}

TEST(NvidiaSmi, AssemblesTwoGpuClassesOnAMixedNode) {
  auto rows = parse_query_gpu(read_data("mixed-a100-v100/query_gpu.csv"));
  auto nvlink = parse_topo_nvlink(read_data("mixed-a100-v100/topo_m.txt"));
  ASSERT_TRUE(rows && nvlink);
  auto gpus = assemble_gpus(*rows, model::CudaVersion{12, 2}, *nvlink);
  ASSERT_TRUE(gpus.has_value()) << gpus.error().message();
  std::set<model::GpuClass> classes;
  for (const auto& gpu : *gpus) classes.insert(gpu.cls);
  EXPECT_EQ(classes.size(), 2u);
  EXPECT_EQ((*gpus)[0].cls, (*gpus)[1].cls);
  EXPECT_NE((*gpus)[1].cls, (*gpus)[2].cls);
  EXPECT_EQ((*gpus)[2].cls.memory_mib, 32768);
  EXPECT_THAT((*gpus)[0].nvlink_peers, ElementsAre(1));
  EXPECT_TRUE((*gpus)[2].nvlink_peers.empty());
}

TEST(NvidiaSmi, AssemblySortsByIndexAndDropsPeersThatWereNotListed) {
  std::vector<GpuRow> rows = {{1, "GPU-b", "X", 10, "550.54.15", "b"},
                              {0, "GPU-a", "X", 10, "550.54.15", "a"}};
  std::map<int, std::vector<int>> nvlink = {{0, {1, 5}}, {1, {0, 1}}};
  auto gpus = assemble_gpus(rows, model::CudaVersion{12, 4}, nvlink);
  ASSERT_TRUE(gpus.has_value());
  EXPECT_EQ((*gpus)[0].index, 0);
  EXPECT_THAT((*gpus)[0].nvlink_peers, ElementsAre(1));
  EXPECT_THAT((*gpus)[1].nvlink_peers, ElementsAre(0));
}

TEST(NvidiaSmi, AssemblyRejectsGpusThatReportDifferentDrivers) {
  std::vector<GpuRow> rows = {{0, "GPU-a", "X", 10, "550.54.15", "a"},
                              {1, "GPU-b", "X", 10, "535.104.05", "b"}};
  auto gpus = assemble_gpus(rows, model::CudaVersion{12, 4}, {});
  ASSERT_FALSE(gpus.has_value());
  EXPECT_THAT(gpus.error().message(), HasSubstr("535.104.05"));
}

// ------------------------------------------------------------------ failures

TEST(NvidiaSmi, RecognisesEveryWayTheDriverSaysItIsNotAnswering) {
  EXPECT_TRUE(is_driver_not_answering(read_data("failures/driver_not_answering.txt")));
  EXPECT_TRUE(is_driver_not_answering(read_data("failures/nvml_version_mismatch.txt")));
  EXPECT_TRUE(is_driver_not_answering("No devices were found\n"));
  EXPECT_TRUE(is_driver_not_answering(
      "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.\n"
      "Make sure that the latest NVIDIA driver is installed and running.\n"));
  EXPECT_FALSE(is_driver_not_answering(read_data("dgx-a100/nvidia_smi.txt")));
  EXPECT_FALSE(is_driver_not_answering(read_data("dgx-a100/query_gpu.csv")));
}

TEST(NvidiaSmi, FailureNamesTheCommandItsStatusAndWhatNvidiaSmiSaid) {
  CommandOutput output{9, 0, read_data("failures/driver_not_answering.txt"), ""};
  Error error = nvidia_smi_failure("`nvidia-smi topo -m`", output);
  EXPECT_EQ(error.code(), ErrorCode::Unavailable);
  EXPECT_THAT(error.message(),
              HasSubstr("`nvidia-smi topo -m` exited with status 9: NVIDIA-SMI has failed because it "
                        "couldn't communicate with the NVIDIA driver. Make sure that the latest "
                        "NVIDIA driver is installed and running."));
}

TEST(NvidiaSmi, FailureFallsBackToStderrAndNamesAKillingSignal) {
  CommandOutput output{128 + 6, 6, "", "Segmentation in libnvidia-ml\n"};
  Error error = nvidia_smi_failure("`nvidia-smi`", output);
  EXPECT_THAT(error.message(), HasSubstr("killed by signal 6"));
  EXPECT_THAT(error.message(), HasSubstr("libnvidia-ml"));
}

}  // namespace
}  // namespace corral::agent
