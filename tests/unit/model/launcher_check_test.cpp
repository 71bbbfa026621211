#include "common/model/launcher_check.hpp"

#include <gtest/gtest.h>

#include "common/model/job_spec_yaml.hpp"

namespace corral::model {
namespace {

JobSpec spec_of(const std::string& yaml) {
  auto spec = parse_job_spec(yaml, "t.yaml");
  EXPECT_TRUE(spec.has_value()) << yaml << (spec ? "" : spec.error().message());
  return spec ? *spec : JobSpec{};
}

std::string warning_for(const std::string& command, const std::string& resources, const std::string& launch = "") {
  auto w = launcher_warning(spec_of("name: t\ncommand: " + command + "\nresources: " + resources + "\n" +
                                    (launch.empty() ? "" : "launch: " + launch + "\n")));
  return w.value_or("");
}

TEST(LauncherWarning, TorchrunInEveryProcessOfSeveralPerNodeIsNamedWithTheWayOut) {
  std::string w = warning_for("torchrun --nproc-per-node 4 train.py", "{nodes: 2, gpus_per_node: 4}");
  EXPECT_EQ(w,
            "the command starts torchrun in every process of the job (4 per node), and each torchrun starts processes "
            "of its own; corral gives every process torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, "
            "MASTER_PORT): give the script itself (-- python3 train.py), or keep torchrun with one process per node "
            "(--procs-per-node 1, launch.procs_per_node: 1)");
}

TEST(LauncherWarning, EachSpellingOfALauncherIsFound) {
  const std::string four = "{gpus_per_node: 4}";
  for (std::string command : {"torchrun train.py", "/opt/conda/bin/torchrun train.py",
                              "'[\"/usr/bin/torchrun\", \"train.py\"]'", "python -m torch.distributed.run train.py",
                              "python3.11 -m torch.distributed.launch train.py",
                              "OMP_NUM_THREADS=4 NCCL_DEBUG=INFO torchrun train.py", "env A=1 torchrun x.py",
                              "exec torchrun x.py", "mpirun -np 4 ./a.out", "deepspeed train.py",
                              "accelerate launch train.py",
                              "'[\"sh\", \"-c\", \"exec torchrun --nproc_per_node 4 train.py\"]'",
                              "'[\"/bin/bash\", \"-c\", \"deepspeed train.py\"]'"}) {
    if (command.front() == '\'') command = command.substr(1, command.size() - 2);  // a YAML list
    EXPECT_NE(warning_for(command, four), "") << command;
  }
  EXPECT_NE(warning_for("srun python3 train.py", "{gpus_per_node: 1}"), "");
}

TEST(LauncherWarning, NothingForAScriptOrForOneLauncherPerNode) {
  EXPECT_EQ(warning_for("python3 train.py", "{nodes: 2, gpus_per_node: 4}"), "");
  EXPECT_EQ(warning_for("python3 -m mypkg.train", "{gpus_per_node: 4}"), "");
  EXPECT_EQ(warning_for("echo torchrun", "{gpus_per_node: 4}"), "");
  EXPECT_EQ(warning_for("./torchrun_wrapper.sh", "{gpus_per_node: 4}"), "");
  // Not an assignment (a name may not begin with a digit): that word is the program.
  EXPECT_EQ(warning_for("2A=x torchrun train.py", "{gpus_per_node: 4}"), "");
  EXPECT_EQ(warning_for("'[\"sh\", \"train.sh\", \"torchrun\"]'", "{gpus_per_node: 4}"), "");
  EXPECT_EQ(warning_for("'[\"python3\", \"-c\", \"torchrun\"]'", "{gpus_per_node: 4}"), "");
  // One process per node: the launcher starts the node's processes, as it expects.
  EXPECT_EQ(warning_for("torchrun --nproc-per-node 4 train.py", "{nodes: 2, gpus_per_node: 4}",
                        "{procs_per_node: 1}"),
            "");
  EXPECT_EQ(warning_for("torchrun train.py", "{gpus_per_node: 1}"), "");
  // gpus: 8 may run as 8 nodes of 1: the narrowest shape has one process per node.
  EXPECT_EQ(warning_for("torchrun train.py", "{gpus: 8}"), "");
  EXPECT_NE(warning_for("torchrun train.py", "{nodes: 2, gpus: 8}"), "");
}

}  // namespace
}  // namespace corral::model
