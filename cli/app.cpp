#include "cli/app.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ostream>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/exit_codes.hpp"
#include "common/core/strings.hpp"
#include "common/core/version.hpp"

namespace corral::cli {

Result<Duration> parse_timeout(const std::string& text) {
  auto d = parse_seconds_or_duration(text);
  if (!d) return make_error(ErrorCode::InvalidArgument, "--timeout: " + d.error().message());
  return *d;
}

namespace {

// CLI11's own range checks print the double range of the type; these name the rule.
CLI::Validator integer_at_least(long long min, const std::string& what) {
  return CLI::Validator(
      [min, what](std::string& value) -> std::string {
        auto v = parse_int<long long>(value);
        if (!v || *v < min) {
          return "must be " + what + ", got \"" + value + "\"";
        }
        return {};
      },
      "", "");
}

// The flags submit and run share with a spec's fields (as sbatch and srun spell them).
struct SpecFlags {
  int nodes = 0;
  int gpus_per_node = 0;
  int gpus = 0;
  std::string time;
  std::string name;
  int priority = 0;
  int retries = 0;
  std::vector<std::int64_t> after_ok;
  std::vector<std::int64_t> after_any;
  std::vector<std::int64_t> after_not_ok;
  std::string array;
  std::string procs_per_node;
  std::vector<CLI::Option*> options;  // in the order add_to adds them

  void add_to(CLI::App* app) {
    const CLI::Validator positive = integer_at_least(1, "a positive integer");
    options = {
        app->add_option("--nodes,-N", nodes, "Run on exactly this many nodes (resources.nodes)")->check(positive),
        app->add_option("--gpus-per-node", gpus_per_node, "GPUs on each node (resources.gpus_per_node)")
            ->check(positive),
        app->add_option("--gpus,-G", gpus, "GPUs in all (resources.gpus)")->check(positive),
        app->add_option("--time", time, "Time limit: 90s, 30m, 2h, 1d (time_limit)"),
        app->add_option("--name,-J", name, "Job name (name)"),
        app->add_option("--priority", priority, "Priority, -1000 to 1000 (priority)")
            ->check(integer_at_least(-1000, "an integer from -1000 to 1000")),
        app->add_option("--retries", retries, "Times a failed attempt is retried, 0 to 10 (retries)")
            ->check(integer_at_least(0, "an integer from 0 to 10")),
        app->add_option("--after-ok", after_ok, "Start only after these jobs COMPLETED (ID,ID,...; after_ok)")
            ->delimiter(',')
            ->check(positive),
        app->add_option("--after-any", after_any, "Start only after these jobs ended, however (after_any)")
            ->delimiter(',')
            ->check(positive),
        app->add_option("--after-not-ok", after_not_ok,
                        "Start only after these jobs ended other than COMPLETED (after_not_ok)")
            ->delimiter(',')
            ->check(positive),
        app->add_option("--array,-a", array,
                        "A job array: one job per index, as sbatch --array (0-99%8, 1,3,5, 0-30:10; array)"),
        app->add_option("--procs-per-node", procs_per_node,
                        "Processes per node: gpus (one per GPU, the default) or a number that divides the GPUs per "
                        "node, as srun --ntasks-per-node (launch.procs_per_node)"),
    };
  }

  // What was given, with the command after `--` (none: keep the spec's).
  model::SpecOverrides overrides(const std::vector<std::string>& command) const {
    model::SpecOverrides o;
    if (*options[0]) o.nodes = nodes;
    if (*options[1]) o.gpus_per_node = gpus_per_node;
    if (*options[2]) o.gpus = gpus;
    if (*options[3]) o.time_limit = time;
    if (*options[4]) o.name = name;
    if (*options[5]) o.priority = priority;
    if (*options[6]) o.retries = retries;
    if (*options[7]) o.after_ok = after_ok;
    if (*options[8]) o.after_any = after_any;
    if (*options[9]) o.after_not_ok = after_not_ok;
    if (*options[10]) o.array = array;
    if (*options[11]) o.procs_per_node = procs_per_node;
    if (!command.empty()) {
      o.command = command;
      // A job without a name is named after its program, as sbatch --wrap names it "wrap".
      if (!o.name) o.name = job_name_for(command.front());
    }
    return o;
  }

  // "/usr/bin/python3.11" -> "python3.11"; characters a name may not hold become '_'.
  static std::string job_name_for(const std::string& program) {
    std::string_view base = base_name(program);
    std::string out;
    for (char c : base.substr(0, 64)) {
      out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
    }
    return out.empty() ? "job" : out;
  }
};

}  // namespace

int run_app(const std::vector<std::string>& all_args, AppContext& ctx) {
  // Everything after the first `--` is the job's command (submit and run), passed as typed.
  std::vector<std::string> args = all_args;
  std::vector<std::string> command;
  bool has_command = false;
  if (auto dashes = std::find(args.begin(), args.end(), "--"); dashes != args.end()) {
    command.assign(dashes + 1, args.end());
    args.erase(dashes, args.end());
    has_command = true;
  }
  CLI::App app{"corral: submit GPU jobs to a corral cluster and watch them", "corral"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_line("corral"));
  // A job id, or ARRAY_INDEX ("42_7") for an element of an array.
  const CLI::Validator job_id = CLI::Validator(
      [](std::string& value) -> std::string {
        auto underscore = value.find('_');
        auto id = parse_int<long long>(value.substr(0, underscore));
        bool ok = id && *id >= 1;
        if (ok && underscore != std::string::npos) {
          auto index = parse_int<int>(value.substr(underscore + 1));
          ok = index && *index >= 0;
        }
        return ok ? std::string() : "must be a job id (a positive integer, or ARRAY_INDEX like 42_7), got \"" + value + "\"";
      },
      "", "");
  // Lets --config follow the subcommand as well as precede it.
  app.fallthrough();
  std::string config_file;
  auto* config_opt =
      app.add_option("--config", config_file,
                     "Settings file (default: $XDG_CONFIG_HOME/corral/config.yaml or "
                     "~/.config/corral/config.yaml); CORRAL_URL, CORRAL_TOKEN and CORRAL_CA override it");

  SubmitOptions submit_opts;
  auto* submit = app.add_subcommand("submit", "Validate a job spec and submit it");
  submit->add_option("FILE", submit_opts.file,
                     "The job spec (YAML); - reads it from standard input; none: the command after -- with the flags");
  SpecFlags submit_flags;
  submit_flags.add_to(submit);
  submit->add_flag("--dry-run", submit_opts.dry_run,
                   "Say where the job would start, or why it would wait; submit nothing");
  submit->add_flag("--json", submit_opts.json, "Print the coordinator's JSON answer");
  submit->add_flag("--parsable", submit_opts.parsable, "Print only the job id (as sbatch --parsable)");
  submit->add_option("--export", submit_opts.export_env,
                     "Which of this shell's environment variables the job gets: ALL (default), NONE, or "
                     "VAR,VAR,... (as sbatch; overrides the spec's export:)");

  RunOptions run_opts;
  auto* run = app.add_subcommand(
      "run", "Submit a job and stay with it: wait for it to start, stream its output, exit with its code (as srun)");
  run->add_option("FILE", run_opts.submit.file, "The job spec (YAML), or none: the command after -- with the flags");
  SpecFlags run_flags;
  run_flags.add_to(run);
  run->add_flag("--label,-l", run_opts.label, "Prefix each output line with its rank (\"3: ...\")");
  run->add_option("--rank", run_opts.rank, "Show only this rank's output")
      ->check(integer_at_least(0, "a rank number (0 or more)"));
  run->add_option("--export", run_opts.submit.export_env, "As for submit");

  SubmitOptions export_opts;
  bool export_slurm = false;
  auto* export_cmd = app.add_subcommand("export", "Print a job spec as a script for another scheduler");
  export_cmd->add_option("FILE", export_opts.file, "The job spec (YAML; - for standard input)");
  export_cmd->add_flag("--slurm", export_slurm, "As an sbatch script with corral's rank environment")->required();
  SpecFlags export_flags;
  export_flags.add_to(export_cmd);

  QueueOptions queue_opts;
  auto* queue = app.add_subcommand("queue", "List live jobs (PENDING, STARTING, RUNNING)");
  queue->add_flag("--all", queue_opts.all, "Every job, ended ones too");
  queue->add_option("--user,-u", queue_opts.users, "Only these users' jobs (USER,USER,...)")->delimiter(',');
  queue->add_option("--state,-t", queue_opts.states,
                    "Only jobs in these states (PENDING,RUNNING,... or PD,R,...); ended states imply --all")
      ->delimiter(',');
  queue->add_flag("--me", queue_opts.me, "Only my jobs");
  queue->add_flag("--json", queue_opts.json, "Print the coordinator's JSON list");

  HistoryOptions history_opts;
  auto* history = app.add_subcommand("history", "List ended jobs from the database (as sacct)");
  history->add_option("--user,-u", history_opts.users, "Only these users' jobs")->delimiter(',');
  history->add_option("--state,-t", history_opts.states, "Only jobs that ended in these states")->delimiter(',');
  history->add_option("--since,-S", history_opts.since,
                      "Ended at or after: 2d, 12h, 2026-12-01, 2026-12-01T10:00 (UTC; default 1d)");
  history->add_option("--until,-E", history_opts.until, "Ended before this moment (same forms)");
  history->add_option("--limit", history_opts.limit, "At most this many jobs (default and most: 100000)")
      ->check(integer_at_least(1, "a positive integer"));
  history->add_flag("--json", history_opts.json, "Print the coordinator's JSON list");

  UsageOptions usage_opts;
  auto* usage_cmd = app.add_subcommand("usage", "GPU-hours used, by user, node or GPU class");
  usage_cmd->add_option("--since,-S", usage_opts.since, "From this moment (as history; default 1d)");
  usage_cmd->add_option("--until,-E", usage_opts.until, "To this moment (default now)");
  usage_cmd->add_option("--by", usage_opts.by, "Group by user (default), node or class")
      ->check(CLI::IsMember({"user", "node", "class"}));
  usage_cmd->add_flag("--json", usage_opts.json, "Print the coordinator's JSON");

  JobOptions show_opts;
  auto* show = app.add_subcommand("show", "Everything about one job: fields, ranks, events");
  show->add_option("JOB", show_opts.job, "Job id")->required()->check(job_id);
  show->add_flag("--json", show_opts.json, "Print the coordinator's JSON");

  bool nodes_json = false;
  bool nodes_gpus = false;
  auto* nodes = app.add_subcommand("nodes", "List nodes: a line each, or their GPUs too");
  nodes->add_flag("--gpus,-g", nodes_gpus, "Under each node, a line per GPU and the job holding it");
  nodes->add_flag("--json", nodes_json, "Print the coordinator's JSON list");
  NodeOptions clear_opts;
  nodes->add_option("--clear", clear_opts.node,
                    "Declare the ranks on NODE dead (admin): for a node that will not come back, frees "
                    "the GPUs and ports its unconfirmed ranks hold");

  CancelOptions cancel_opts;
  auto* cancel = app.add_subcommand("cancel", "Cancel jobs (their owner or an admin): by id, or every live job matching --user/--state");
  cancel->add_option("JOB", cancel_opts.jobs, "Job ids")->check(job_id);
  cancel->add_option("--user,-u", cancel_opts.users, "Every live job of these users (yours unless you are an admin)")
      ->delimiter(',');
  cancel->add_option("--state,-t", cancel_opts.states, "Only jobs in these states (PENDING,RUNNING,...)")->delimiter(',');
  cancel->add_flag("--json", cancel_opts.json, "Print the coordinator's JSON answer");

  WaitOptions wait_opts;
  std::string timeout_text;
  auto* wait = app.add_subcommand("wait", "Wait until a job ends; exit 0 only if it COMPLETED");
  wait->add_option("JOB", wait_opts.job, "Job id")->required()->check(job_id);
  auto* timeout_opt =
      wait->add_option("--timeout", timeout_text, "Give up after S seconds (or 90s, 30m, 2h) with exit 1");
  wait->add_flag("--json", wait_opts.json, "Print the job's final JSON");

  LogsOptions logs_opts;
  auto* logs = app.add_subcommand("logs", "Print a rank's output (its owner or an admin)");
  logs->add_option("JOB", logs_opts.job, "Job id")->required()->check(job_id);
  logs->add_option("--rank", logs_opts.rank, "Rank (default 0)")
      ->check(integer_at_least(0, "a rank number (0 or more)"));
  logs->add_flag("--follow,-f", logs_opts.follow,
                 "Keep printing until the rank has ended and its log is drained");

  StackOptions stack_opts;
  auto* stack = app.add_subcommand("stack", "Show where a running job's ranks are: /proc state, native and Python stacks");
  stack->add_option("JOB", stack_opts.job, "Job id")->required()->check(job_id);
  stack->add_option("--rank", stack_opts.rank, "Only this rank")
      ->check(integer_at_least(0, "a rank number (0 or more)"));
  stack->add_flag("--json", stack_opts.json, "Print the coordinator's JSON answer");

  NodeOptions drain_opts;
  auto* drain = app.add_subcommand("drain", "Stop placing jobs on a node (admin)");
  drain->add_option("NODE", drain_opts.node, "Node name")->required();
  drain->add_option("--reason", drain_opts.reason, "Why, shown in `corral nodes`")->required();
  drain->add_flag("--json", drain_opts.json, "Print the coordinator's JSON answer");

  NodeOptions resume_opts;
  auto* resume = app.add_subcommand("resume", "Place jobs on a drained node again (admin)");
  resume->add_option("NODE", resume_opts.node, "Node name")->required();
  resume->add_flag("--json", resume_opts.json, "Print the coordinator's JSON answer");

  try {
    // CLI11 takes the arguments last first.
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e, ctx.out, ctx.err);
    return code == 0 ? kExitOk : kExitUsage;
  }

  auto usage = [&ctx](const std::string& message) {
    ctx.err << "corral: " << message << "\n";
    return kExitUsage;
  };
  if (*timeout_opt) {
    auto t = parse_timeout(timeout_text);
    if (!t) return usage(t.error().message());
    wait_opts.timeout = *t;
  }
  if (*drain && drain_opts.reason.empty()) return usage("drain: --reason must not be empty");
  if (has_command && !*submit && !*run && !*export_cmd) {
    return usage("a command after -- is for submit, run and export only");
  }
  if (has_command && command.empty()) return usage("nothing after --: give the command to run");
  if (*cancel && cancel_opts.jobs.empty() && cancel_opts.users.empty() && cancel_opts.states.empty()) {
    return usage("cancel: name the jobs (JOB...), or choose them with --user and/or --state");
  }
  if (*cancel && !cancel_opts.jobs.empty() && (!cancel_opts.users.empty() || !cancel_opts.states.empty())) {
    return usage("cancel: give job ids or --user/--state, not both");
  }

  std::optional<std::string> config;
  if (*config_opt) config = config_file;
  auto api = ctx.make_api([config, env = ctx.env] { return load_connection_settings(config, env); });
  CommandContext cc{*api, ctx.out, ctx.err, ctx.clock, ctx.sleep, ctx.interrupts, ctx.err_is_tty};
  if (*submit) {
    submit_opts.submit_dir = ctx.cwd;
    submit_opts.environ = ctx.environ;
    submit_opts.in = ctx.in;
    submit_opts.overrides = submit_flags.overrides(command);
    return run_submit(cc, submit_opts);
  }
  if (*run) {
    run_opts.submit.submit_dir = ctx.cwd;
    run_opts.submit.environ = ctx.environ;
    run_opts.submit.in = ctx.in;
    run_opts.submit.overrides = run_flags.overrides(command);
    return run_run(cc, run_opts);
  }
  if (*export_cmd) {
    export_opts.in = ctx.in;
    export_opts.overrides = export_flags.overrides(command);
    return run_export(cc, export_opts);
  }
  if (*queue) return run_queue(cc, queue_opts);
  if (*show) return run_show(cc, show_opts);
  if (*history) return run_history(cc, history_opts);
  if (*usage_cmd) return run_usage(cc, usage_opts);
  if (*nodes && !clear_opts.node.empty()) {
    clear_opts.json = nodes_json;
    return run_clear(cc, clear_opts);
  }
  if (*nodes) return run_nodes(cc, nodes_json, nodes_gpus);
  if (*cancel) return run_cancel(cc, cancel_opts);
  if (*wait) return run_wait(cc, wait_opts);
  if (*logs) return run_logs(cc, logs_opts);
  if (*stack) return run_stack(cc, stack_opts);
  if (*drain) return run_drain(cc, drain_opts);
  if (*resume) return run_resume(cc, resume_opts);
  return usage("no command given; see corral --help");
}

}  // namespace corral::cli
