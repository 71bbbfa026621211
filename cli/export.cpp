// `corral export --slurm`: a job spec as an sbatch script that runs the same job on a
// Slurm cluster, with corral's rank contract built from Slurm's own variables.

#include <cmath>
#include <ostream>

#include "cli/commands.hpp"
#include "cli/exit_codes.hpp"
#include "common/core/strings.hpp"
#include "common/core/version.hpp"

namespace corral::cli {

namespace {

// 'text' for bash: single quotes, each ' written as '\''.
std::string shell_quote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Slurm's --time: D-HH:MM:SS, rounded up to the second.
std::string slurm_time(Duration d) {
  long long s = (d.count() + 999) / 1000;
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%lld-%02lld:%02lld:%02lld", s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace

std::string format_sbatch(const model::JobSpec& spec, const std::string& source) {
  const auto shapes = model::candidate_shapes(spec);
  const auto [nodes, gpus] = shapes.empty() ? std::pair{1, 1} : shapes.front();
  const int tasks = spec.procs_per_node == 0 ? gpus : spec.procs_per_node;
  std::string s = "#!/bin/bash\n";
  s += "# " + spec.name + ": exported from " + source + " by `corral export --slurm` (" + version_line("corral") + ").\n";
  s += "# Every rank gets corral's environment (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK,\n";
  s += "# WORLD_SIZE, ...) from Slurm's own variables; MASTER_PORT comes from the job id.\n";
  s += "#SBATCH --job-name=" + spec.name + "\n";
  s += "#SBATCH --nodes=" + std::to_string(nodes) + "\n";
  s += "#SBATCH --ntasks-per-node=" + std::to_string(tasks) + "\n";
  s += "#SBATCH --gres=gpu:" + std::to_string(gpus) + "\n";
  if (spec.time_limit) s += "#SBATCH --time=" + slurm_time(*spec.time_limit) + "\n";
  if (!spec.workdir.empty()) s += "#SBATCH --chdir=" + spec.workdir + "\n";
  if (spec.export_env) {
    s += "#SBATCH --export=" +
         (spec.export_env->all ? std::string("ALL")
                               : spec.export_env->names.empty() ? std::string("NONE") : join(spec.export_env->names, ",")) +
         "\n";
  }
  if (spec.array) {
    s += "#SBATCH --array=" + model::format_indices(spec.array->indices) +
         (spec.array->max_running > 0 ? "%" + std::to_string(spec.array->max_running) : "") + "\n";
  }
  // What Slurm has no exact word for, said where a reader will look.
  if (!shapes.empty() && !spec.nodes) {
    s += "# resources.gpus: " + std::to_string(model::total_gpus(spec)) + " in all, as " + std::to_string(nodes) +
         " x " + std::to_string(gpus) + " (the fewest nodes corral would use).\n";
  }
  if (!spec.gpu.model.empty() || spec.gpu.min_memory_mib || spec.gpu.min_cuda) {
    s += "# resources.gpu (model, memory, CUDA) has no portable Slurm form: add a typed gres\n";
    s += "# (--gres=gpu:TYPE:N) or a --constraint your cluster defines.\n";
  }
  if (!spec.dependencies.empty()) {
    s += "# after_ok/after_any/after_not_ok name corral job ids: give Slurm's own with\n";
    s += "# --dependency=afterok:ID (afterany, afternotok).\n";
  }
  if (spec.retries > 0) s += "# retries: " + std::to_string(spec.retries) + " in corral; Slurm's nearest is --requeue.\n";
  if (spec.mode == model::LaunchMode::Nccl) {
    s += "# mode: nccl: corral's CORRAL_NCCL_UNIQUE_ID has no Slurm counterpart; the program must\n";
    s += "# make and share its ncclUniqueId itself.\n";
  }
  s += "\n";
  for (const auto& [k, v] : spec.env) s += "export " + k + "=" + shell_quote(v) + "\n";
  s += "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n";
  s += "export MASTER_ADDR=$(scontrol show node \"$head_node\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')\n";
  s += "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n";
  s += "export WORLD_SIZE=$SLURM_NTASKS ROLE_WORLD_SIZE=$SLURM_NTASKS LOCAL_WORLD_SIZE=" + std::to_string(tasks) +
       " GROUP_WORLD_SIZE=$SLURM_JOB_NUM_NODES\n";
  s += "export ROLE_NAME=default TORCHELASTIC_RESTART_COUNT=${SLURM_RESTART_COUNT:-0} TORCHELASTIC_MAX_RESTARTS=" +
       std::to_string(spec.retries) + " TORCHELASTIC_RUN_ID=$SLURM_JOB_ID TORCHELASTIC_USE_AGENT_STORE=False\n";
  s += "export CUDA_DEVICE_ORDER=PCI_BUS_ID CORRAL_JOB_ID=$SLURM_JOB_ID CORRAL_ATTEMPT=${SLURM_RESTART_COUNT:-0} "
       "CORRAL_JOB_NAME=" + shell_quote(spec.name) + " CORRAL_NNODES=$SLURM_JOB_NUM_NODES\n";
  s += "export CORRAL_NODELIST=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | paste -sd, -)\n";
  if (tasks > 1) s += "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}\n";
  if (spec.array) s += "export CORRAL_ARRAY_JOB_ID=$SLURM_ARRAY_JOB_ID CORRAL_ARRAY_INDEX=$SLURM_ARRAY_TASK_ID\n";
  // Per rank: Slurm's task variables under corral's names, then the command itself.
  std::string per_rank =
      "export RANK=$SLURM_PROCID ROLE_RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID NODE_RANK=$SLURM_NODEID "
      "GROUP_RANK=$SLURM_NODEID; ";
  if (spec.gpu_visibility == model::GpuVisibility::Rank) {
    // gpu_visibility: rank: each rank sees only its share of the node's GPUs.
    per_rank += "IFS=, read -ra g <<< \"$CUDA_VISIBLE_DEVICES\"; n=$(( ${#g[@]} / " + std::to_string(tasks) +
                " )); CUDA_VISIBLE_DEVICES=$(IFS=,; echo \"${g[*]:$((LOCAL_RANK * n)):$n}\"); "
                "export CUDA_VISIBLE_DEVICES; ";
  }
  per_rank += "exec \"$@\"";
  std::vector<std::string> argv =
      spec.command.shell ? std::vector<std::string>{"/bin/sh", "-c", spec.command.argv.front()} : spec.command.argv;
  s += "srun --kill-on-bad-exit=1 bash -c " + shell_quote(per_rank) + " corral-rank";
  for (const auto& a : argv) s += " " + shell_quote(a);
  s += "\n";
  return s;
}

int run_export(CommandContext& ctx, const SubmitOptions& options) {
  std::string file_name;
  auto checked = load_spec(ctx, options, file_name);
  if (auto* code = std::get_if<int>(&checked)) return *code;
  const auto& spec = std::get<1>(checked).second;
  ctx.out << format_sbatch(spec, file_name);
  return kExitOk;
}

}  // namespace corral::cli
