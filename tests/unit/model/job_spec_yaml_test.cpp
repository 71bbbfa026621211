#include "common/model/job_spec_yaml.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace corral::model {
namespace {

using namespace std::chrono_literals;

// A bad spec and the whole error it must produce, every line, exactly: the messages are
// the interface people read, so any change to them shows up here.
struct BadSpec {
  std::string name;
  std::string yaml;
  std::string expected;
  SpecLimits limits = {};
};

// Shown when a case fails, instead of gtest's byte dump.
void PrintTo(const BadSpec& spec, std::ostream* out) {
  *out << spec.name;
}

std::string repeat(std::string_view piece, std::size_t times) {
  std::string out;
  for (std::size_t i = 0; i < times; ++i) out += piece;
  return out;
}

// A valid job with `resources:` last, so cases can append to it or replace the tail.
constexpr std::string_view kHead = "name: t\ncommand: c\n";
std::string with_head(std::string_view rest) {
  return std::string(kHead) + std::string(rest);
}
// kHead plus a valid resources section: lines 1-4; a case's own lines start at 5.
std::string valid_plus(std::string_view rest) {
  return with_head("resources:\n  gpus_per_node: 1\n") + std::string(rest);
}

SpecLimits limits_with(auto change) {
  SpecLimits limits;
  change(limits);
  return limits;
}

std::vector<BadSpec> bad_specs() {
  std::vector<BadSpec> cases = {
      // The document as a whole.
      {"FileOverTheSizeLimit", "name: t\n# " + repeat("x", 70000 - 11) + "\n",
       "job.yaml: file is 70000 bytes; the limit is 65536"},
      {"EmptyFile", "", "job.yaml: the document is empty; a job needs at least name, command and resources"},
      {"OnlyComments", "# nothing yet\n\n",
       "job.yaml: the document is empty; a job needs at least name, command and resources"},
      {"NullDocument", "~\n",
       "job.yaml:1:1: the document is empty; a job needs at least name, command and resources"},
      {"TopLevelList", "- name: t\n- command: c\n",
       "job.yaml:1:1: the document must be a map of fields like name: and command:, got a list"},
      {"TopLevelScalar", "hello\n",
       "job.yaml:1:1: the document must be a map of fields like name: and command:, got \"hello\""},
      {"AnSbatchScript", "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:4\nsrun python3 train.py\n",
       "job.yaml:4:1: the document must be a map of fields like name: and command:, got \"srun python3 train.py\" "
       "(this looks like a shell script: a spec is YAML; to run a script, give it as the command, e.g. corral "
       "submit -N 2 --gpus-per-node 4 -- bash job.sh; docs/cli.md, \"Coming from Slurm\")"},
      {"AScriptWithoutAShebangWhoseCommandIsNotYaml", "#SBATCH -J x\necho a: b: c\n",
       "job.yaml:2:10: YAML syntax error: illegal map value (this looks like a shell script: a spec is YAML; to "
       "run a script, give it as the command, e.g. corral submit -N 2 --gpus-per-node 4 -- bash job.sh; "
       "docs/cli.md, \"Coming from Slurm\")"},
      {"YamlSyntaxError", "name: t\ncommand: [a, b\nresources: {gpus: 1}\n",
       "job.yaml:3:10: YAML syntax error: end of sequence flow not found"},
      {"MapValueWhereNoneMayBe", "name: t\ncommand: a: b\n",
       "job.yaml:2:11: YAML syntax error: illegal map value"},
      {"TabIndentation", "name: t\ncommand: c\nresources:\n\tgpus: 1\n",
       "job.yaml:4:6: YAML syntax error: illegal map value (YAML does not allow tabs for indentation)"},
      {"UndefinedAlias", "name: *who\n",
       "job.yaml:1:7: YAML syntax error: the referenced anchor is not defined"},
      // yaml-cpp's LoadAll never ended on this one, found by fuzz/job_spec_fuzz.
      {"ACommaBeginsTheDocument", ",\n",
       "job.yaml:1:1: the document is empty; a job needs at least name, command and resources"},
      {"TwoDocuments", valid_plus("---\nname: u\n"),
       "job.yaml:6:1: found a second YAML document; a file holds one job"},
      {"EveryRequiredFieldMissing", "priority: 1\n",
       "job.yaml:1:1: name: required field is missing\n"
       "job.yaml:1:1: command: required field is missing\n"
       "job.yaml:1:1: resources: required field is missing"},
      {"MisspelledTopLevelField", "names: t\ncommand: c\nresources: {gpus: 1}\n",
       "job.yaml:1:1: names: unknown field; did you mean \"name\"?\n"
       "job.yaml:1:1: name: required field is missing"},
      {"UnknownTopLevelField", valid_plus("colour: red\n"),
       "job.yaml:5:1: colour: unknown field; expected one of name, command, workdir, env, export, resources, launch, "
       "time_limit, priority, retries, after_ok, after_any, after_not_ok, array"},
      {"DependencyThatIsNotAJobId", valid_plus("after_ok: [3, x, 0]\nafter_any: []\n"),
       "job.yaml:5:15: after_ok[1]: must be a job id (a positive integer), got \"x\"\n"
       "job.yaml:5:18: after_ok[2]: must be a job id (a positive integer), got \"0\"\n"
       "job.yaml:6:12: after_any: must not be an empty list"},
      {"ArrayThatIsNotSlurmsSyntax", valid_plus("array: \"9-1%2\"\n"),
       "job.yaml:5:8: array: a range must not run backwards (write indices like \"0-99%8\", \"1,3,5\" or "
       "\"0-30:10\"), got \"9-1%2\""},
      {"DuplicateTopLevelField", valid_plus("name: u\n"),
       "job.yaml:5:1: name: duplicate key; first set on line 1"},
      {"ListAsAKey", valid_plus("? [a, b]\n: 1\n"),
       "job.yaml:5:3: keys must be plain words, got a list as a key"},
      {"MergeKey", valid_plus("<<: {priority: 1}\n"),
       "job.yaml:5:1: \"<<\": unknown field; YAML merge keys are not supported"},
      {"NestedTooDeep", valid_plus("env: {A: {B: {C: {D: {E: {F: {G: x}}}}}}}\n"),
       "job.yaml:5:31: env.A.B.C.D.E.F.G: nested more than 8 levels deep"},
      {"FlowNestingBeyondTheParser", valid_plus("env: " + repeat("[", 3000) + repeat("]", 3000) + "\n"),
       "job.yaml:5:6006: nested more than 8 levels deep"},
      {"AliasThatContainsItself", valid_plus("workdir: &loop [*loop]\n"),
       "job.yaml:5:10: workdir[0][0][0][0][0][0][0]: nested more than 8 levels deep"},
      {"BillionLaughs",
       valid_plus("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                  "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                  "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                  "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                  "g: [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"),
       "job.yaml:8:1: d: the document expands to more than 4096 YAML nodes (each use of an alias counts again)"},

      // name
      {"NameWithASpace", "name: my job\ncommand: c\nresources: {gpus: 1}\n",
       "job.yaml:1:7: name: must be 1 to 64 letters, digits, '.', '_' or '-', got \"my job\""},
      {"NameLongerThan64", "name: " + repeat("n", 65) + "\ncommand: c\nresources: {gpus: 1}\n",
       "job.yaml:1:7: name: must be 1 to 64 letters, digits, '.', '_' or '-', got "
       "\"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...\""},
      {"NameIsAMap", "name: {first: t}\ncommand: c\nresources: {gpus: 1}\n",
       "job.yaml:1:7: name: must be 1 to 64 letters, digits, '.', '_' or '-', got a map"},
      {"NameLeftEmpty", "name:\ncommand: c\nresources: {gpus: 1}\n",
       "job.yaml:1:1: name: must be 1 to 64 letters, digits, '.', '_' or '-', got an empty value"},
      {"NameEmptyString", "name: \"\"\ncommand: c\nresources: {gpus: 1}\n",
       "job.yaml:1:7: name: must be 1 to 64 letters, digits, '.', '_' or '-', got \"\""},

      // command
      {"CommandBlank", "name: t\ncommand: \"  \"\nresources: {gpus: 1}\n",
       "job.yaml:2:10: command: must not be empty"},
      {"CommandEmptyList", "name: t\ncommand: []\nresources: {gpus: 1}\n",
       "job.yaml:2:10: command: must not be an empty list"},
      {"CommandIsAMap", "name: t\ncommand: {run: train.py}\nresources: {gpus: 1}\n",
       "job.yaml:2:10: command: must be a string (run by /bin/sh -c) or a list of strings (run directly), "
       "got a "
       "map"},
      {"CommandLeftEmpty", "name: t\ncommand:\nresources: {gpus: 1}\n",
       "job.yaml:2:1: command: must be a string (run by /bin/sh -c) or a list of strings (run directly), got "
       "an "
       "empty value"},
      {"CommandListHoldsAMap", "name: t\ncommand: [python3, {script: x.py}]\nresources: {gpus: 1}\n",
       "job.yaml:2:20: command[1]: must be a string, got a map"},
      {"CommandListHoldsAnEmptyItem", "name: t\ncommand:\n  - python3\n  -\nresources: {gpus: 1}\n",
       "job.yaml:3:3: command[1]: must be a string, got an empty value"},
      {"CommandProgramEmpty", "name: t\ncommand: [\"\", x]\nresources: {gpus: 1}\n",
       "job.yaml:2:11: command[0]: the program to run must not be empty"},
      {"CommandWithNul", "name: t\ncommand: \"echo a\\0b\"\nresources: {gpus: 1}\n",
       "job.yaml:2:10: command: must not contain a NUL character"},
      {"CommandStringTooLong", "name: t\ncommand: " + repeat("x", 16385) + "\nresources: {gpus: 1}\n",
       "job.yaml:2:10: command: is 16385 bytes long; the limit is 16384"},
      {"CommandArgumentTooLong",
       "name: t\ncommand: [echo, " + repeat("x", 4097) + "]\nresources: {gpus: 1}\n",
       "job.yaml:2:17: command[1]: is 4097 bytes long; the limit is 4096"},
      {"CommandListTooLongInAll", "name: t\ncommand: [echo, abcdef, ghijkl]\nresources: {gpus: 1}\n",
       "job.yaml:2:10: command: is 16 bytes long in all; the limit is 10",
       limits_with([](SpecLimits& l) { l.max_command_bytes = 10; })},

      // workdir
      {"WorkdirRelative", valid_plus("workdir: data/alice\n"),
       "job.yaml:5:10: workdir: must be an absolute path, got \"data/alice\""},
      {"WorkdirIsAList", valid_plus("workdir: [/a, /b]\n"),
       "job.yaml:5:10: workdir: must be an absolute path, got a list"},
      {"WorkdirTooLong", valid_plus("workdir: /" + repeat("d", 4096) + "\n"),
       "job.yaml:5:10: workdir: is 4097 bytes long; the limit is 4096"},

      // env
      {"EnvIsAList", valid_plus("env: [NCCL_DEBUG=INFO]\n"),
       "job.yaml:5:6: env: must be a map of NAME: value, got a list"},
      {"EnvNameStartsWithADigit", valid_plus("env: {1X: a}\n"),
       "job.yaml:5:7: env.1X: is not a valid variable name (letters, digits and '_', not starting with a "
       "digit)"},
      {"EnvNameWithADash", valid_plus("env: {MY-VAR: a}\n"),
       "job.yaml:5:7: env.MY-VAR: is not a valid variable name (letters, digits and '_', not starting with a "
       "digit)"},
      {"EnvNameWithASpace", valid_plus("env: {\"MY VAR\": a}\n"),
       "job.yaml:5:7: env.\"MY VAR\": is not a valid variable name (letters, digits and '_', not starting "
       "with a "
       "digit)"},
      {"EnvSetsRank", valid_plus("env: {RANK: \"0\"}\n"),
       "job.yaml:5:7: env.RANK: corral sets RANK itself for every rank; remove it"},
      {"EnvSetsEveryRendezvousVariable",
       valid_plus(
           "env:\n  WORLD_SIZE: 8\n  LOCAL_RANK: 0\n  LOCAL_WORLD_SIZE: 4\n  NODE_RANK: 0\n"
           "  GROUP_RANK: 0\n  MASTER_ADDR: 10.0.0.1\n  MASTER_PORT: 29500\n  CUDA_VISIBLE_DEVICES: 0,1\n"),
       "job.yaml:6:3: env.WORLD_SIZE: corral sets WORLD_SIZE itself for every rank; remove it\n"
       "job.yaml:7:3: env.LOCAL_RANK: corral sets LOCAL_RANK itself for every rank; remove it\n"
       "job.yaml:8:3: env.LOCAL_WORLD_SIZE: corral sets LOCAL_WORLD_SIZE itself for every rank; remove it\n"
       "job.yaml:9:3: env.NODE_RANK: corral sets NODE_RANK itself for every rank; remove it\n"
       "job.yaml:10:3: env.GROUP_RANK: corral sets GROUP_RANK itself for every rank; remove it\n"
       "job.yaml:11:3: env.MASTER_ADDR: corral sets MASTER_ADDR itself for every rank; remove it\n"
       "job.yaml:12:3: env.MASTER_PORT: corral sets MASTER_PORT itself for every rank; remove it\n"
       "job.yaml:13:3: env.CUDA_VISIBLE_DEVICES: corral sets CUDA_VISIBLE_DEVICES itself for every rank; "
       "remove "
       "it"},
      {"EnvSetsACorralVariable", valid_plus("env: {CORRAL_JOB_ID: \"7\"}\n"),
       "job.yaml:5:7: env.CORRAL_JOB_ID: corral sets CORRAL_* variables itself; remove it"},
      {"EnvValueIsAMap", valid_plus("env:\n  OPTS: {a: 1}\n"),
       "job.yaml:6:9: env.OPTS: must be a string, number or boolean, got a map"},
      {"EnvValueLeftEmpty", valid_plus("env:\n  OPTS:\n"),
       "job.yaml:6:3: env.OPTS: must be a value; write \"\" for an empty string"},
      {"EnvVariableTwice", valid_plus("env:\n  A: x\n  A: y\n"),
       "job.yaml:7:3: env.A: duplicate key; first set on line 6"},
      {"EnvValueTooLong", valid_plus("env: {A: " + repeat("v", 4097) + "}\n"),
       "job.yaml:5:10: env.A: is 4097 bytes long; the limit is 4096"},
      {"EnvTooManyEntries", valid_plus("env: {A: 1, B: 2, C: 3}\n"),
       "job.yaml:5:6: env: has 3 entries; the limit is 2",
       limits_with([](SpecLimits& l) { l.max_env_entries = 2; })},
      {"EnvTooManyBytes", valid_plus("env: {AB: cd, EF: gh}\n"),
       "job.yaml:5:6: env: holds 8 bytes of names and values; the limit is 7",
       limits_with([](SpecLimits& l) { l.max_env_bytes = 7; })},

      // resources
      {"ResourcesIsANumber", with_head("resources: 4\n"),
       "job.yaml:3:12: resources: must be a map with gpus_per_node or gpus, got \"4\""},
      {"ResourcesLeftEmpty", with_head("resources:\n"),
       "job.yaml:3:1: resources: must be a map with gpus_per_node or gpus, got an empty value"},
      {"ResourcesWithoutGpus", with_head("resources:\n  nodes: 2\n"),
       "job.yaml:4:3: resources: needs gpus_per_node (GPUs on each node) or gpus (GPUs in total)"},
      {"ResourcesMisspelledGpusPerNode", with_head("resources:\n  nodes: 2\n  gpu_per_node: 4\n"),
       "job.yaml:4:3: resources: needs gpus_per_node (GPUs on each node) or gpus (GPUs in total)\n"
       "job.yaml:5:3: resources.gpu_per_node: unknown field; did you mean \"gpus_per_node\"?"},
      {"ResourcesGpusPerNodeAndGpus", with_head("resources:\n  gpus_per_node: 4\n  gpus: 8\n"),
       "job.yaml:5:3: resources.gpus: give gpus_per_node or gpus, not both"},
      {"GpusPerNodeAWord", with_head("resources:\n  nodes: 2\n  gpus_per_node: four\n"),
       "job.yaml:5:18: resources.gpus_per_node: must be a positive integer, got \"four\""},
      {"GpusPerNodeZero", with_head("resources:\n  gpus_per_node: 0\n"),
       "job.yaml:4:18: resources.gpus_per_node: must be a positive integer, got \"0\""},
      {"GpusPerNodeOverTheLimit", with_head("resources:\n  gpus_per_node: 65\n"),
       "job.yaml:4:18: resources.gpus_per_node: must be at most 64, got \"65\""},
      {"GpusPerNodeIsAList", with_head("resources:\n  gpus_per_node: [0, 1]\n"),
       "job.yaml:4:18: resources.gpus_per_node: must be a positive integer, got a list"},
      {"NodesNegative", with_head("resources:\n  nodes: -2\n  gpus_per_node: 1\n"),
       "job.yaml:4:10: resources.nodes: must be a positive integer, got \"-2\""},
      {"NodesFractional", with_head("resources:\n  nodes: 2.5\n  gpus_per_node: 1\n"),
       "job.yaml:4:10: resources.nodes: must be a positive integer, got \"2.5\""},
      {"NodesOverTheLimit", with_head("resources:\n  nodes: 1025\n  gpus_per_node: 1\n"),
       "job.yaml:4:10: resources.nodes: must be at most 1024, got \"1025\""},
      {"GpusBeyondAnyInteger", with_head("resources:\n  gpus: 99999999999999999999999\n"),
       "job.yaml:4:9: resources.gpus: must be at most 65536, got \"99999999999999999999999\""},
      {"GpusNotAMultipleOfNodes", with_head("resources:\n  nodes: 4\n  gpus: 6\n"),
       "job.yaml:5:9: resources.gpus: must be a multiple of resources.nodes (4), got \"6\""},
      {"GpusPutTooManyOnEachNode", with_head("resources:\n  nodes: 1\n  gpus: 128\n"),
       "job.yaml:5:9: resources.gpus: puts 128 GPUs on each node; the limit is 64"},
      {"GpusThatNoShapeFits", with_head("resources:\n  gpus: 1031\n"),
       "job.yaml:4:9: resources.gpus: cannot be spread evenly over at most 1024 nodes of at most 64 GPUs, "
       "got "
       "\"1031\""},
      {"TooManyRanks", with_head("resources:\n  nodes: 2\n  gpus_per_node: 4\n"),
       "job.yaml:4:3: resources: the job would start 8 processes (nodes x processes per node); the limit is "
       "6",
       limits_with([](SpecLimits& l) { l.max_ranks = 6; })},

      // resources.gpu
      {"GpuIsAString", with_head("resources:\n  gpus: 1\n  gpu: A100\n"),
       "job.yaml:5:8: resources.gpu: must be a map with model, min_memory_gb or min_cuda, got \"A100\""},
      {"GpuModelEmpty", with_head("resources:\n  gpus: 1\n  gpu: {model: \"\"}\n"),
       "job.yaml:5:16: resources.gpu.model: must not be empty; leave model out to accept any GPU"},
      {"GpuModelIsAList", with_head("resources:\n  gpus: 1\n  gpu: {model: [A100, H100]}\n"),
       "job.yaml:5:16: resources.gpu.model: must be a GPU name or a glob, got a list"},
      {"GpuMemoryWithAUnit", with_head("resources:\n  gpus: 1\n  gpu: {min_memory_gb: 40GB}\n"),
       "job.yaml:5:24: resources.gpu.min_memory_gb: must be a positive number of GB like 40 or 39.5, got "
       "\"40GB\""},
      {"GpuMemoryZero", with_head("resources:\n  gpus: 1\n  gpu: {min_memory_gb: 0}\n"),
       "job.yaml:5:24: resources.gpu.min_memory_gb: must be a positive number of GB like 40 or 39.5, got "
       "\"0\""},
      {"GpuMemoryNegative", with_head("resources:\n  gpus: 1\n  gpu: {min_memory_gb: -40}\n"),
       "job.yaml:5:24: resources.gpu.min_memory_gb: must be a positive number of GB like 40 or 39.5, got "
       "\"-40\""},
      {"GpuMemoryAbsurd", with_head("resources:\n  gpus: 1\n  gpu: {min_memory_gb: 20000}\n"),
       "job.yaml:5:24: resources.gpu.min_memory_gb: must be at most 16384, got \"20000\""},
      {"GpuCudaAWord", with_head("resources:\n  gpus: 1\n  gpu: {min_cuda: twelve}\n"),
       "job.yaml:5:19: resources.gpu.min_cuda: must be a CUDA version like 12.1, got \"twelve\""},
      {"GpuCudaThreeParts", with_head("resources:\n  gpus: 1\n  gpu: {min_cuda: 12.1.1}\n"),
       "job.yaml:5:19: resources.gpu.min_cuda: must be a CUDA version like 12.1, got \"12.1.1\""},
      {"GpuMisspelledField", with_head("resources:\n  gpus: 1\n  gpu: {min_memory: 40}\n"),
       "job.yaml:5:9: resources.gpu.min_memory: unknown field; did you mean \"min_memory_gb\"?"},
      {"GpuUnknownField", with_head("resources:\n  gpus: 1\n  gpu: {vendor: nvidia}\n"),
       "job.yaml:5:9: resources.gpu.vendor: unknown field; expected one of model, min_memory_gb, min_cuda"},

      // launch
      {"LaunchIsAString", valid_plus("launch: torchrun\n"),
       "job.yaml:5:9: launch: must be a map with mode, procs_per_node, gpu_visibility, rendezvous_timeout, on_rendezvous_timeout or hang_timeout, got \"torchrun\""},
      {"LaunchModeUnknown", valid_plus("launch: {mode: mpi}\n"),
       "job.yaml:5:16: launch.mode: must be torch or nccl, got \"mpi\""},
      {"LaunchMisspelledMode", valid_plus("launch: {mod: nccl}\n"),
       "job.yaml:5:10: launch.mod: unknown field; did you mean \"mode\"?"},
      {"RendezvousTimeoutWithoutAUnit", valid_plus("launch: {rendezvous_timeout: 30}\n"),
       "job.yaml:5:30: launch.rendezvous_timeout: missing unit (s, m, h or d) in duration \"30\", or 0 for none"},
      {"OnRendezvousTimeoutUnknown", valid_plus("launch: {on_rendezvous_timeout: retry}\n"),
       "job.yaml:5:33: launch.on_rendezvous_timeout: must be fail or warn, got \"retry\""},
      {"HangTimeoutAList", valid_plus("launch: {hang_timeout: [5m]}\n"),
       "job.yaml:5:24: launch.hang_timeout: must be a duration like 5m, or 0 for none, got a list"},
      {"ProcsPerNodeAWord", valid_plus("launch: {procs_per_node: all}\n"),
       "job.yaml:5:26: launch.procs_per_node: must be \"gpus\" or a positive integer, got \"all\""},
      {"ProcsPerNodeZero", valid_plus("launch: {procs_per_node: 0}\n"),
       "job.yaml:5:26: launch.procs_per_node: must be \"gpus\" or a positive integer, got \"0\""},
      {"ProcsPerNodeOverTheLimit", valid_plus("launch: {procs_per_node: 65}\n"),
       "job.yaml:5:26: launch.procs_per_node: must be at most 64, got \"65\""},
      {"ProcsPerNodeNotDividingGpusPerNode",
       with_head("resources:\n  gpus_per_node: 6\nlaunch:\n  procs_per_node: 4\n"),
       "job.yaml:6:19: launch.procs_per_node: must divide resources.gpus_per_node (6), got \"4\""},
      {"ProcsPerNodeNotDividingEachNodesShare",
       with_head("resources:\n  nodes: 2\n  gpus: 6\nlaunch:\n  procs_per_node: 2\n"),
       "job.yaml:7:19: launch.procs_per_node: must divide each node's share of resources.gpus (3), got "
       "\"2\""},
      {"ProcsPerNodeNotDividingAnyShape", with_head("resources:\n  gpus: 6\nlaunch:\n  procs_per_node: 4\n"),
       "job.yaml:6:19: launch.procs_per_node: must divide the GPUs per node for some way to spread "
       "resources.gpus (6) over nodes, got \"4\""},

      // time_limit, priority, retries
      {"TimeLimitWithoutAUnit", valid_plus("time_limit: 90\n"),
       "job.yaml:5:13: time_limit: missing unit (s, m, h or d) in duration \"90\""},
      {"TimeLimitInWords", valid_plus("time_limit: 2 hours\n"),
       "job.yaml:5:13: time_limit: missing unit (s, m, h or d) in duration \"2 hours\""},
      {"TimeLimitZero", valid_plus("time_limit: 0s\n"),
       "job.yaml:5:13: time_limit: duration must be positive, got \"0s\""},
      {"TimeLimitOverAYear", valid_plus("time_limit: 366d\n"),
       "job.yaml:5:13: time_limit: duration longer than 365d: \"366d\""},
      {"TimeLimitIsAMap", valid_plus("time_limit: {hours: 2}\n"),
       "job.yaml:5:13: time_limit: must be a duration like 2h or 90m, got a map"},
      {"PriorityOverTheRange", valid_plus("priority: 1001\n"),
       "job.yaml:5:11: priority: must be an integer from -1000 to 1000, got \"1001\""},
      {"PriorityAWord", valid_plus("priority: high\n"),
       "job.yaml:5:11: priority: must be an integer from -1000 to 1000, got \"high\""},
      {"RetriesNegative", valid_plus("retries: -1\n"),
       "job.yaml:5:10: retries: must be an integer from 0 to 10, got \"-1\""},
      {"RetriesOverTheRange", valid_plus("retries: 11\n"),
       "job.yaml:5:10: retries: must be an integer from 0 to 10, got \"11\""},
      {"RetriesFractional", valid_plus("retries: 1.5\n"),
       "job.yaml:5:10: retries: must be an integer from 0 to 10, got \"1.5\""},

      {"InvalidNodesDoNotHideAProcsPerNodeMistake",
       with_head("resources:\n  nodes: 0\n  gpus_per_node: 4\nlaunch:\n  procs_per_node: 3\n"),
       "job.yaml:4:10: resources.nodes: must be a positive integer, got \"0\"\n"
       "job.yaml:7:19: launch.procs_per_node: must divide resources.gpus_per_node (4), got \"3\""},

      // Several mistakes at once: each is reported, in the order of the file.
      {"ManyMistakesAtOnce",
       "name: my job\n"
       "command: []\n"
       "env: {RANK: 1}\n"
       "resources:\n"
       "  nodes: 2\n"
       "  gpus_per_node: four\n"
       "  gpu: {min_cuda: x}\n"
       "launch: {mode: mpi}\n"
       "priority: 5000\n",
       "job.yaml:1:7: name: must be 1 to 64 letters, digits, '.', '_' or '-', got \"my job\"\n"
       "job.yaml:2:10: command: must not be an empty list\n"
       "job.yaml:3:7: env.RANK: corral sets RANK itself for every rank; remove it\n"
       "job.yaml:6:18: resources.gpus_per_node: must be a positive integer, got \"four\"\n"
       "job.yaml:7:19: resources.gpu.min_cuda: must be a CUDA version like 12.1, got \"x\"\n"
       "job.yaml:8:16: launch.mode: must be torch or nccl, got \"mpi\"\n"
       "job.yaml:9:11: priority: must be an integer from -1000 to 1000, got \"5000\""},
  };
  return cases;
}

class JobSpecYamlBadSpec : public ::testing::TestWithParam<BadSpec> {};

TEST_P(JobSpecYamlBadSpec, IsRejectedWithExactlyTheseProblems) {
  const BadSpec& c = GetParam();
  auto result = parse_job_spec(c.yaml, "job.yaml", c.limits);
  ASSERT_FALSE(result.has_value()) << "accepted:\n" << c.yaml;
  EXPECT_EQ(result.error().code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(result.error().message(), c.expected);
}

INSTANTIATE_TEST_SUITE_P(Corpus, JobSpecYamlBadSpec, ::testing::ValuesIn(bad_specs()),
                         [](const ::testing::TestParamInfo<BadSpec>& param) { return param.param.name; });

TEST(JobSpecYaml, CorpusCoversAtLeastFortyFiveBadSpecs) {
  EXPECT_GE(bad_specs().size(), 45u);
}

JobSpec parse_ok(std::string_view yaml) {
  auto result = parse_job_spec_detailed(yaml);
  std::string problems;
  for (const auto& p : result.problems) problems += p.format("job.yaml") + "\n";
  EXPECT_TRUE(result.spec.has_value()) << problems;
  EXPECT_EQ(problems, "");
  return result.spec.value_or(JobSpec{});
}

TEST(JobSpecYaml, ReadsEveryFieldOfAFullSpec) {
  JobSpec spec = parse_ok(R"(
name: resnet50-ddp
command: python train.py --epochs 10
workdir: /data/alice/resnet
env:
  NCCL_DEBUG: INFO
  SEED: 42
  DETERMINISTIC: true
  EMPTY: ""
resources:
  nodes: 2
  gpus_per_node: 4
  gpu:
    model: "NVIDIA A100*"
    min_memory_gb: 39.5
    min_cuda: 12.1
launch:
  mode: nccl
  procs_per_node: 2
time_limit: 1h30m
priority: -20
retries: 3
)");
  EXPECT_EQ(spec.name, "resnet50-ddp");
  EXPECT_EQ(spec.command, (Command{true, {"python train.py --epochs 10"}}));
  EXPECT_EQ(spec.workdir, "/data/alice/resnet");
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(spec.env,
            (Env{{"NCCL_DEBUG", "INFO"}, {"SEED", "42"}, {"DETERMINISTIC", "true"}, {"EMPTY", ""}}));
  EXPECT_EQ(spec.nodes, 2);
  EXPECT_EQ(spec.gpus_per_node, 4);
  EXPECT_EQ(spec.total_gpus, std::nullopt);
  EXPECT_EQ(spec.gpu.model, "NVIDIA A100*");
  EXPECT_EQ(spec.gpu.min_memory_mib, 40448);  // 39.5 * 1024
  EXPECT_EQ(spec.gpu.min_cuda, (CudaVersion{12, 1}));
  EXPECT_EQ(spec.mode, LaunchMode::Nccl);
  EXPECT_EQ(spec.procs_per_node, 2);
  EXPECT_EQ(spec.time_limit, std::optional<Duration>(90min));
  EXPECT_EQ(spec.priority, -20);
  EXPECT_EQ(spec.retries, 3);
}

TEST(JobSpecYaml, LeavesOptionalFieldsAtTheirDefaults) {
  JobSpec spec = parse_ok("name: t\ncommand: nvidia-smi\nresources:\n  gpus_per_node: 1\n");
  EXPECT_EQ(spec.workdir, "");
  EXPECT_TRUE(spec.env.empty());
  EXPECT_EQ(spec.nodes, 1);  // gpus_per_node alone means one node
  EXPECT_EQ(spec.gpus_per_node, 1);
  EXPECT_EQ(spec.total_gpus, std::nullopt);
  EXPECT_EQ(spec.gpu, GpuConstraint{});
  EXPECT_EQ(spec.mode, LaunchMode::Torch);
  EXPECT_EQ(spec.procs_per_node, 0);
  EXPECT_EQ(spec.time_limit, std::nullopt);
  EXPECT_EQ(spec.priority, 0);
  EXPECT_EQ(spec.retries, 0);
  EXPECT_EQ(spec.rendezvous_timeout, std::chrono::minutes(5));
  EXPECT_EQ(spec.on_rendezvous_timeout, OnRendezvousTimeout::Fail);
  EXPECT_EQ(spec.hang_timeout, Duration(0));
}

TEST(JobSpecYaml, ReadsTheWatchDeadlinesAndZeroTurnsThemOff) {
  JobSpec spec = parse_ok(
      "name: t\ncommand: x\nresources: {gpus: 1}\n"
      "launch: {rendezvous_timeout: 90s, on_rendezvous_timeout: warn, hang_timeout: 10m}\n");
  EXPECT_EQ(spec.rendezvous_timeout, std::chrono::seconds(90));
  EXPECT_EQ(spec.on_rendezvous_timeout, OnRendezvousTimeout::Warn);
  EXPECT_EQ(spec.hang_timeout, std::chrono::minutes(10));
  JobSpec off = parse_ok("name: t\ncommand: x\nresources: {gpus: 1}\nlaunch: {rendezvous_timeout: 0}\n");
  EXPECT_EQ(off.rendezvous_timeout, Duration(0));
}

TEST(JobSpecYaml, RunsAListCommandDirectlyAndAStringThroughTheShell) {
  JobSpec list = parse_ok("name: t\ncommand: [corral-worker, tcp-check, \"\"]\nresources: {gpus: 1}\n");
  EXPECT_EQ(list.command, (Command{false, {"corral-worker", "tcp-check", ""}}));
  JobSpec text = parse_ok("name: t\ncommand: |\n  cd /tmp\n  ./run.sh\nresources: {gpus: 1}\n");
  EXPECT_EQ(text.command, (Command{true, {"cd /tmp\n./run.sh\n"}}));
}

TEST(JobSpecYaml, TotalGpusLeaveTheNodeCountToTheScheduler) {
  JobSpec spec = parse_ok("name: t\ncommand: c\nresources: {gpus: 8}\nlaunch: {procs_per_node: 4}\n");
  EXPECT_EQ(spec.total_gpus, 8);
  EXPECT_EQ(spec.nodes, std::nullopt);
  EXPECT_EQ(spec.gpus_per_node, std::nullopt);
  EXPECT_EQ(spec.procs_per_node, 4);
  EXPECT_EQ(candidate_shapes(spec), (std::vector<std::pair<int, int>>{{1, 8}, {2, 4}}));
}

TEST(JobSpecYaml, NodesWithTotalGpusFixTheNodeCount) {
  JobSpec spec = parse_ok("name: t\ncommand: c\nresources: {nodes: 2, gpus: 8}\n");
  EXPECT_EQ(spec.nodes, 2);
  EXPECT_EQ(spec.total_gpus, 8);
  EXPECT_EQ(spec.gpus_per_node, std::nullopt);
  EXPECT_EQ(candidate_shapes(spec), (std::vector<std::pair<int, int>>{{2, 4}}));
}

TEST(JobSpecYaml, ProcsPerNodeGpusMeansOneProcessPerGpu) {
  JobSpec spec =
      parse_ok("name: t\ncommand: c\nresources: {gpus_per_node: 4}\nlaunch: {procs_per_node: gpus}\n");
  EXPECT_EQ(spec.procs_per_node, 0);
}

TEST(JobSpecYaml, AcceptsCudaVersionsAndMemoryInEveryWrittenForm) {
  JobSpec whole =
      parse_ok("name: t\ncommand: c\nresources: {gpus: 1, gpu: {min_cuda: 12, min_memory_gb: 80}}\n");
  EXPECT_EQ(whole.gpu.min_cuda, (CudaVersion{12, 0}));
  EXPECT_EQ(whole.gpu.min_memory_mib, 80 * 1024);
  JobSpec quoted =
      parse_ok("name: t\ncommand: c\nresources: {gpus: 1, gpu: {min_cuda: \"11.8\", min_memory_gb: 0.3}}\n");
  EXPECT_EQ(quoted.gpu.min_cuda, (CudaVersion{11, 8}));
  EXPECT_EQ(quoted.gpu.min_memory_mib, 307);  // 307.2 MiB, rounded down
}

TEST(JobSpecYaml, AcceptsQuotedNumbersAndADocumentMarker) {
  JobSpec spec =
      parse_ok("---\nname: \"42\"\ncommand: c\nresources: {gpus_per_node: \"2\"}\npriority: \"-5\"\n...\n");
  EXPECT_EQ(spec.name, "42");
  EXPECT_EQ(spec.gpus_per_node, 2);
  EXPECT_EQ(spec.priority, -5);
}

TEST(JobSpecYaml, ExpandsAliasesThatStayWithinTheBounds) {
  JobSpec spec =
      parse_ok("name: t\ncommand: [&py python3, train.py]\nenv: {PYTHON: *py}\nresources: {gpus: 1}\n");
  EXPECT_EQ(spec.env, (std::vector<std::pair<std::string, std::string>>{{"PYTHON", "python3"}}));
}

TEST(JobSpecYaml, ListsEveryProblemNotOnlyTheFirst) {
  auto result = parse_job_spec_detailed("name: a b\ncommand: {}\nresources: {gpus: 0}\nretries: 99\n");
  EXPECT_FALSE(result.spec.has_value());
  ASSERT_EQ(result.problems.size(), 4u);
  EXPECT_EQ(result.problems[0].path, "name");
  EXPECT_EQ(result.problems[1].path, "command");
  EXPECT_EQ(result.problems[2].path, "resources.gpus");
  EXPECT_EQ(result.problems[3].path, "retries");
}

TEST(JobSpecYaml, ProblemsCarryLineColumnAndPath) {
  auto result =
      parse_job_spec_detailed("name: t\ncommand: c\nresources:\n  nodes: 2\n  gpus_per_node: four\n");
  ASSERT_EQ(result.problems.size(), 1u);
  const SpecProblem& p = result.problems[0];
  EXPECT_EQ(p.line, 5);
  EXPECT_EQ(p.column, 18);
  EXPECT_EQ(p.path, "resources.gpus_per_node");
  EXPECT_EQ(p.format("job.yaml"),
            "job.yaml:5:18: resources.gpus_per_node: must be a positive integer, got \"four\"");
}

TEST(JobSpecYaml, FormatsAProblemWithoutAPositionWithoutLineAndColumn) {
  EXPECT_EQ((SpecProblem{0, 0, "", "file is 70000 bytes; the limit is 65536"}.format("job.yaml")),
            "job.yaml: file is 70000 bytes; the limit is 65536");
  EXPECT_EQ((SpecProblem{0, 0, "env", "too big"}.format("j.yaml")), "j.yaml: env: too big");
  EXPECT_EQ((SpecProblem{3, 1, "", "bad"}.format("j.yaml")), "j.yaml:3:1: bad");
}

TEST(JobSpecYaml, StopsABillionLaughsDocumentWithoutExpandingIt) {
  // Nine levels of ten: a walk that expanded it would visit a billion nodes.
  std::string yaml = "name: t\ncommand: c\nresources: {gpus: 1}\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 8; ++i) {
    std::string prev = "*l" + std::to_string(i - 1);
    yaml +=
        "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [" + repeat(prev + ", ", 9) + prev + "]\n";
  }
  SpecLimits deep;
  deep.max_depth = 100;  // so that only the node count can stop it
  auto result = parse_job_spec_detailed(yaml, deep);
  ASSERT_EQ(result.problems.size(), 1u);
  // Named by the field under which the expansion passed the limit.
  EXPECT_EQ(
      result.problems[0].format("job.yaml"),
      "job.yaml:7:1: l3: the document expands to more than 4096 YAML nodes (each use of an alias counts again)");
}

TEST(JobSpecYaml, NeverThrowsOnHostileInput) {
  const std::vector<std::string> inputs = {
      std::string("\0\0\0", 3),
      "\t\tname: t\n",
      "{{{{",
      "]]]",
      "name: !!binary AAAA\n",
      "%YAML 9.9\n---\na: 1\n",
      "&a\n",
      "? ? ? x\n",
      "name: \"\\uZZZZ\"\n",
      "\xff\xfe\x00\x41",
      repeat("- ", 5000),
  };
  for (const auto& input : inputs) {
    SpecParseResult result;
    EXPECT_NO_THROW(result = parse_job_spec_detailed(input)) << input;
    EXPECT_FALSE(result.spec.has_value()) << input;
    EXPECT_FALSE(result.problems.empty()) << input;
  }
}

// ---- command-line overrides

JobSpec parsed(const std::string& text) {
  auto spec = parse_job_spec(text, "t.yaml");
  EXPECT_TRUE(spec.has_value()) << text << "\n" << (spec ? "" : spec.error().message());
  return spec ? *spec : JobSpec{};
}

TEST(SpecOverrides, FlagsAloneMakeASpecWithOneGpuPerNodeAndTheCommandAsAList) {
  SpecOverrides o;
  o.name = "echo";
  o.command = std::vector<std::string>{"/bin/echo", "a b", "$HOME", "--x: y"};
  JobSpec spec = parsed(apply_spec_overrides("", o));
  EXPECT_EQ(spec.name, "echo");
  EXPECT_FALSE(spec.command.shell);
  EXPECT_EQ(spec.command.argv, (std::vector<std::string>{"/bin/echo", "a b", "$HOME", "--x: y"}));
  EXPECT_EQ(spec.gpus_per_node, 1);
  o.nodes = 2;
  o.gpus = 8;
  o.time_limit = "1h";
  o.priority = -5;
  o.retries = 2;
  spec = parsed(apply_spec_overrides("", o));
  EXPECT_EQ(spec.nodes, 2);
  EXPECT_EQ(spec.gpus_per_node, 4);  // 8 in all over 2 nodes
  EXPECT_EQ(spec.time_limit, std::chrono::hours(1));
  EXPECT_EQ(spec.priority, -5);
  EXPECT_EQ(spec.retries, 2);
}

TEST(SpecOverrides, FlagsReplaceTheFilesFieldsAndKeepTheRest) {
  const std::string file =
      "name: train\ncommand: python3 train.py\nenv: {A: \"1\"}\nresources:\n  gpus: 8\n  gpu: {model: \"NVIDIA A100*\"}\n"
      "launch: {mode: nccl}\n";
  SpecOverrides o;
  o.gpus_per_node = 2;
  JobSpec spec = parsed(apply_spec_overrides(file, o));
  EXPECT_EQ(spec.gpus_per_node, 2);
  EXPECT_FALSE(spec.total_gpus.has_value());  // a per-node count replaces the total
  EXPECT_EQ(spec.gpu.model, "NVIDIA A100*");
  EXPECT_EQ(spec.mode, LaunchMode::Nccl);
  EXPECT_EQ(spec.env, (std::vector<std::pair<std::string, std::string>>{{"A", "1"}}));
  EXPECT_TRUE(spec.command.shell);
  SpecOverrides n;
  n.nodes = 4;
  spec = parsed(apply_spec_overrides(file, n));
  EXPECT_EQ(spec.nodes, 4);
  EXPECT_EQ(spec.gpus_per_node, 2);  // the file's 8 in all, over 4 nodes
  EXPECT_EQ(apply_spec_overrides(file, {}), file);  // no flags: the file as written
}

TEST(SpecOverrides, ProcsPerNodeSetsTheLaunchFieldAndKeepsTheOthers) {
  const std::string file = "name: t\ncommand: c\nresources: {nodes: 2, gpus_per_node: 4}\nlaunch: {mode: nccl}\n";
  SpecOverrides o;
  o.procs_per_node = "2";
  JobSpec spec = parsed(apply_spec_overrides(file, o));
  EXPECT_EQ(spec.procs_per_node, 2);
  EXPECT_EQ(spec.mode, LaunchMode::Nccl);
  o.procs_per_node = "gpus";
  spec = parsed(apply_spec_overrides(file, o));
  EXPECT_EQ(spec.procs_per_node, 0);  // one per GPU
  SpecOverrides alone;
  alone.name = "torchrun";
  alone.command = std::vector<std::string>{"torchrun", "train.py"};
  alone.gpus_per_node = 4;
  alone.procs_per_node = "1";
  spec = parsed(apply_spec_overrides("", alone));
  EXPECT_EQ(spec.procs_per_node, 1);
  // A value the parser refuses comes back under the flag's field, for the CLI to name.
  alone.procs_per_node = "3";
  auto bad = parse_job_spec_detailed(apply_spec_overrides("", alone));
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(bad.problems[0].path, "launch.procs_per_node");
  const auto fields = alone.fields();
  EXPECT_NE(std::find(fields.begin(), fields.end(), std::pair<std::string, std::string>{"launch.procs_per_node",
                                                                                         "--procs-per-node"}),
            fields.end());
}

TEST(SpecOverrides, TextThatIsNotAMapWithinTheLimitsIsLeftForTheParserToReport) {
  SpecOverrides o;
  o.nodes = 2;
  for (std::string text : {"[1, 2]", "a: [b", "name: x\n---\nname: y\n"}) {
    EXPECT_EQ(apply_spec_overrides(text, o), text);
  }
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'h'; ++c) {
    bomb += std::string(1, c) + ": &" + std::string(1, c) + " [*" + std::string(1, c - 1) + ", *" +
            std::string(1, c - 1) + ", *" + std::string(1, c - 1) + ", *" + std::string(1, c - 1) + "]\n";
  }
  EXPECT_EQ(apply_spec_overrides(bomb, o), bomb);
}

// ---- arrays

TEST(JobArray, SlurmsSyntaxRangesListsStepsAndTheLimit) {
  auto a = parse_array("0-99%8");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->indices.size(), 100u);
  EXPECT_EQ(a->max_running, 8);
  a = parse_array("7,1-3,0-30:10,3");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->indices, (std::vector<int>{0, 1, 2, 3, 7, 10, 20, 30}));  // sorted, once each
  EXPECT_EQ(a->max_running, 0);
  EXPECT_EQ(format_indices(a->indices), "0-3,7,10,20,30");
  EXPECT_EQ(pending_array_ref(42, a->indices, 0), "42_[0-3,7,10,20,30]");
  EXPECT_EQ(pending_array_ref(42, {3, 4, 5}, 8), "42_[3-5%8]");
  EXPECT_EQ(pending_array_ref(42, {7}, 8), "42_[7%8]");
  EXPECT_EQ(pending_array_ref(42, {7}, 0), "42_7");
  for (const char* bad : {"", "%4", "1-", "a", "1-5%0", "1-5:0", "-3", "0-1000001", "0-20000"}) {
    EXPECT_FALSE(parse_array(bad).has_value()) << bad;
  }
  EXPECT_EQ(parse_array("0-20000").error().message(),
            "an array holds at most 10000 elements (write indices like \"0-99%8\", \"1,3,5\" or \"0-30:10\"), got "
            "\"0-20000\"");
}

}  // namespace
}  // namespace corral::model
