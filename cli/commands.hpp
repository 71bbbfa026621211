#pragma once
// The `corral` commands: each calls the coordinator through an ApiClient, prints to the
// streams it is given and returns the process's exit code (exit_codes.hpp). Run on the
// calling thread; polling commands wait through CommandContext::sleep.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cli/api_client.hpp"
#include "common/core/time.hpp"
#include "common/model/job_spec_yaml.hpp"
#include "common/model/submission.hpp"

namespace corral::cli {

struct CommandContext {
  ApiClient& api;
  std::ostream& out;
  std::ostream& err;
  const Clock& clock;
  // Waits between polls; tests pass one that only advances a fake clock.
  std::function<void(Duration)> sleep;
  // How many times Ctrl-C (SIGINT) was pressed so far; unset: never.
  std::function<int()> interrupts = {};
  bool err_is_tty = false;  // stderr is a terminal: `run` shows a spinner while pending
};

struct SubmitOptions {
  std::string file;                       // "-": the spec comes from `in`
  bool dry_run = false;
  bool json = false;
  std::optional<std::string> export_env = std::nullopt;  // --export: ALL, NONE or VAR,...; unset: the spec's, else ALL
  std::string submit_dir = {};            // where `corral submit` runs (the default workdir)
  model::EnvList environ = {};            // the submitting process's environment
  std::istream* in = nullptr;             // standard input, for "-"
  bool parsable = false;                  // print the id alone (sbatch --parsable)
  model::SpecOverrides overrides = {};    // --nodes, --time, -- COMMAND, ...: replace the spec's
};

// `corral run`: a submission followed to its end.
struct RunOptions {
  SubmitOptions submit;
  bool label = false;         // prefix each line with its rank ("3: ...")
  std::optional<int> rank;    // only this rank's output
  Duration poll_interval = std::chrono::milliseconds(250);
  Duration start_poll_interval = std::chrono::milliseconds(500);
};

struct QueueOptions {
  bool all = false;
  std::vector<std::string> users;   // empty: everyone's
  std::vector<std::string> states;  // empty: every live state (every state with all)
  bool me = false;                  // the caller's own jobs (added to users)
  bool json = false;
};

// `corral history` (as sacct) and `corral usage` (GPU-hours).
struct HistoryOptions {
  std::vector<std::string> users;
  std::vector<std::string> states;
  std::string since;  // empty: the coordinator's default (a day back)
  std::string until;
  int limit = 0;      // 0: the coordinator's
  bool json = false;
};
struct UsageOptions {
  std::string since;
  std::string until;
  std::string by = "user";
  bool json = false;
};

// `corral cancel ID...`, or every live job matching --user/--state.
struct CancelOptions {
  std::vector<std::string> jobs;  // ids, or ARRAY_INDEX; an array's id cancels every element
  std::vector<std::string> users;
  std::vector<std::string> states;
  bool json = false;
};

struct JobOptions {
  std::string job;  // "42", or "42_7": element 7 of array 42
  bool json = false;
};

// How long one `wait` request may be held by the coordinator (it allows up to 60 s; the
// HTTP client's timeout is 30 s).
inline constexpr Duration kWaitHold = std::chrono::seconds(20);

struct WaitOptions {
  std::string job;  // "42", or "42_7": element 7 of array 42
  std::optional<Duration> timeout = std::nullopt;  // nullopt: wait for as long as it takes
  bool json = false;
  Duration poll_interval = std::chrono::milliseconds(200);
  // Once the job has been seen, how long the coordinator may stay unreachable (it may
  // be restarting) before waiting gives up.
  Duration reconnect_patience = std::chrono::seconds(60);
};

struct LogsOptions {
  std::string job;  // "42", or "42_7": element 7 of array 42
  int rank = 0;
  bool follow = false;
  Duration poll_interval = std::chrono::milliseconds(250);
  // --follow on a job that has not started: how often to look whether it has.
  Duration start_poll_interval = std::chrono::milliseconds(500);
};

struct StackOptions {
  std::string job;  // "42", or "42_7": element 7 of array 42
  std::optional<int> rank;
  bool json = false;
};

struct NodeOptions {
  std::string node;
  std::string reason;  // drain only
  bool json = false;
};

// The spec as it will be sent: the file (or standard input, or nothing) with the flags
// applied, and its text; every problem printed (the file's with line and column, a
// flag's by its name) and the exit code when there is one. `file_name` is what messages
// call the source.
std::variant<int, std::pair<std::string, model::JobSpec>> load_spec(CommandContext& ctx, const SubmitOptions& options,
                                                                    std::string& file_name);
// The spec as an sbatch script for a Slurm cluster (corral export --slurm).
std::string format_sbatch(const model::JobSpec& spec, const std::string& source);
int run_export(CommandContext& ctx, const SubmitOptions& options);
// Checks the spec (file, standard input or flags alone) and sends it: the coordinator's
// answer, or the exit code once the failure has been printed.
std::variant<int, std::string> send_submission(CommandContext& ctx, const SubmitOptions& options);
int run_submit(CommandContext& ctx, const SubmitOptions& options);
// Submits, waits for the job to start (saying why it waits), streams its ranks' output
// line by line to `out`, and exits as `wait` does. Ctrl-C cancels the job and goes on
// showing it until it ends; a second Ctrl-C within a second leaves it running (130).
int run_run(CommandContext& ctx, const RunOptions& options);
int run_queue(CommandContext& ctx, const QueueOptions& options);
int run_show(CommandContext& ctx, const JobOptions& options);
int run_history(CommandContext& ctx, const HistoryOptions& options);
int run_usage(CommandContext& ctx, const UsageOptions& options);
int run_nodes(CommandContext& ctx, bool json, bool gpus);
int run_cancel(CommandContext& ctx, const CancelOptions& options);
// 0 when the job ends COMPLETED; 1 on any other end state or on timeout.
int run_wait(CommandContext& ctx, const WaitOptions& options);
int run_logs(CommandContext& ctx, const LogsOptions& options);
// Where every rank (or one) is: /proc state, native and Python stacks, from its node.
int run_stack(CommandContext& ctx, const StackOptions& options);
int run_drain(CommandContext& ctx, const NodeOptions& options);
// `corral nodes --clear NODE` (admin): the node will not come back; its ranks that were
// never confirmed dead are declared so, and the GPUs and ports they fenced are freed.
int run_clear(CommandContext& ctx, const NodeOptions& options);
int run_resume(CommandContext& ctx, const NodeOptions& options);

}  // namespace corral::cli
