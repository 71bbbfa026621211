#include "common/model/launcher_check.hpp"

#include <string_view>
#include <vector>

#include "common/core/strings.hpp"
#include "common/model/job_spec_text.hpp"

namespace corral::model {
namespace {

// A shell line's first words, split at blanks (quotes are not followed; a launcher is
// named before any).
std::vector<std::string_view> split_line(std::string_view line) {
  std::vector<std::string_view> words;
  constexpr std::string_view kBlank = " \t\n";
  for (std::size_t at = line.find_first_not_of(kBlank); at != std::string_view::npos && words.size() < 8;) {
    std::size_t end = line.find_first_of(kBlank, at);
    words.push_back(line.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
    at = end == std::string_view::npos ? end : line.find_first_not_of(kBlank, end);
  }
  return words;
}

// The words of a command as far as they name its program: a list's elements, or a shell
// line's words; `sh -c LINE` (or bash, dash, zsh) is read as LINE.
std::vector<std::string_view> leading_words(const Command& command) {
  if (command.argv.empty()) return {};
  if (command.shell) return split_line(command.argv.front());
  std::vector<std::string_view> words(command.argv.begin(), command.argv.end());
  if (words.size() >= 3 && words[1] == "-c") {
    std::string_view shell = base_name(words[0]);
    if (shell == "sh" || shell == "bash" || shell == "dash" || shell == "zsh") return split_line(words[2]);
  }
  return words;
}

// VAR=value, as a shell line or `env` puts before the program.
bool is_assignment(std::string_view word) {
  auto eq = word.find('=');
  return eq != std::string_view::npos && spec_text::valid_env_name(word.substr(0, eq));
}

enum class Launcher { None, Torchrun, Srun, Other };

// The launcher the command starts with, and its name as the person wrote it.
std::pair<Launcher, std::string> launcher_of(const Command& command) {
  auto words = leading_words(command);
  std::size_t i = 0;
  // Words that run the rest: env (and its assignments), exec, nohup, time.
  while (i < words.size()) {
    std::string_view b = base_name(words[i]);
    if (b == "env" || b == "exec" || b == "nohup" || b == "time" || is_assignment(words[i])) {
      ++i;
    } else {
      break;
    }
  }
  if (i >= words.size()) return {Launcher::None, ""};
  std::string_view program = base_name(words[i]);
  if (program == "torchrun") return {Launcher::Torchrun, "torchrun"};
  if (program == "srun") return {Launcher::Srun, "srun"};
  if (program == "mpirun" || program == "mpiexec" || program == "deepspeed") {
    return {Launcher::Other, std::string(program)};
  }
  if (program == "accelerate" && i + 1 < words.size() && words[i + 1] == "launch") {
    return {Launcher::Other, "accelerate launch"};
  }
  if (program.starts_with("python") && i + 2 < words.size() && words[i + 1] == "-m" &&
      (words[i + 2] == "torch.distributed.run" || words[i + 2] == "torch.distributed.launch")) {
    return {Launcher::Torchrun, std::string(program) + " -m " + std::string(words[i + 2])};
  }
  return {Launcher::None, ""};
}

// The fewest processes the job can have on a node: launch.procs_per_node, else one per
// GPU of the narrowest shape the job accepts.
int fewest_procs_per_node(const JobSpec& spec) {
  if (spec.procs_per_node > 0) return spec.procs_per_node;
  int fewest = 0;
  for (const auto& [nodes, per_node] : candidate_shapes(spec)) {
    if (fewest == 0 || per_node < fewest) fewest = per_node;
  }
  return fewest;
}

}  // namespace

std::optional<std::string> launcher_warning(const JobSpec& spec) {
  auto [launcher, name] = launcher_of(spec.command);
  if (launcher == Launcher::None) return std::nullopt;
  if (launcher == Launcher::Srun) {
    return "the command starts srun, Slurm's launcher, in every process of the job; corral starts the processes "
           "itself and gives each RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: give the program srun "
           "would run (-- python3 train.py)";
  }
  const int per_node = fewest_procs_per_node(spec);
  if (per_node <= 1) return std::nullopt;  // one launcher per node: what it expects
  std::string message = "the command starts " + name + " in every process of the job (" + std::to_string(per_node) +
                        " per node), and each " + name + " starts processes of its own; ";
  if (launcher == Launcher::Torchrun) {
    message += "corral gives every process torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, "
               "MASTER_PORT): give the script itself (-- python3 train.py), or keep " + name +
               " with one process per node (--procs-per-node 1, launch.procs_per_node: 1)";
  } else {
    message += "keep it with one process per node (--procs-per-node 1, launch.procs_per_node: 1)";
  }
  return message;
}

}  // namespace corral::model
