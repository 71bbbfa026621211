#include "cli/commands.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "cli/exit_codes.hpp"
#include "cli/format.hpp"
#include "cli/views.hpp"
#include "common/core/strings.hpp"
#include "common/model/job_spec_yaml.hpp"
#include "common/model/launcher_check.hpp"
#include "common/net/http_types.hpp"

namespace corral::cli {

namespace {

using Json = nlohmann::json;

int fail(CommandContext& ctx, const Error& error) {
  ctx.err << "corral: " << error.message() << "\n";
  return exit_code_for(error);
}

// One call that must answer `expected`; any other answer becomes its Error.
Result<std::string> call(CommandContext& ctx, const std::string& method, const std::string& target,
                         const std::string& body = {}, int expected = 200) {
  auto r = ctx.api.call(method, target, body);
  if (!r) return std::unexpected(r.error());
  if (r->status != expected) return std::unexpected(error_from_response(*r));
  return std::move(r->body);
}

int print_json(CommandContext& ctx, const std::string& body) {
  auto pretty = pretty_json(body);
  if (!pretty) return fail(ctx, pretty.error());
  ctx.out << *pretty;
  return kExitOk;
}

std::string job_path(const std::string& ref) {
  return "/v1/jobs/" + net::percent_encode(ref);
}

// Reads the spec file, refusing more than the coordinator would take before reading it all.
Result<std::string> read_spec(const std::string& path, std::size_t limit) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return make_error(ErrorCode::InvalidArgument, path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::InvalidArgument, "cannot read " + path + ": " + std::strerror(errno));
  std::string text(limit + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return make_error(ErrorCode::InvalidArgument, "cannot read " + path);
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > limit) {
    auto size = std::filesystem::file_size(path, ec);
    std::string how_big = ec ? "more than " + std::to_string(limit) : std::to_string(size);
    return make_error(ErrorCode::InvalidArgument,
                      path + ": file is " + how_big + " bytes; the limit is " + std::to_string(limit));
  }
  return text;
}

// Standard input, up to the same limit.
Result<std::string> read_spec_stream(std::istream& in, std::size_t limit) {
  std::string text(limit + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return make_error(ErrorCode::InvalidArgument, "cannot read the spec from standard input");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > limit) {
    return make_error(ErrorCode::InvalidArgument,
                      "standard input: the spec is more than " + std::to_string(limit) + " bytes; the limit is " +
                          std::to_string(limit));
  }
  return text;
}

// "a,b" "c" -> "a,b,c", percent-encoded for a query.
std::string query_list(const std::vector<std::string>& items) {
  std::string joined;
  for (const auto& i : items) joined += (joined.empty() ? "" : ",") + i;
  return net::percent_encode(joined);
}

// The field a problem is about, as its flag when a flag set it.
std::optional<std::string> flag_for(const model::SpecOverrides& overrides, const std::string& path) {
  for (const auto& [field, flag] : overrides.fields()) {
    if (path == field || path.rfind(field + ".", 0) == 0) return flag;
  }
  return std::nullopt;
}

// The spec as it will be sent: the file (or standard input, or nothing) with the flags
// applied, checked here first so that every problem is shown before anything is sent:
// those of the file with its path, line and column as typed, which editors and
// terminals jump to; those of a flag by the flag's name. An exit code on failure.
}  // namespace

std::variant<int, std::pair<std::string, model::JobSpec>> load_spec(CommandContext& ctx, const SubmitOptions& options,
                                                                    std::string& file_name) {
  const model::SpecLimits limits;
  const auto& overrides = options.overrides;
  std::string text;
  if (options.file.empty()) {
    if (!overrides.command) {
      ctx.err << "corral: give a job spec FILE (- for standard input), or the command after --\n";
      return kExitUsage;
    }
    file_name = "command line";
  } else {
    const bool from_stdin = options.file == "-";
    if (from_stdin && options.in == nullptr) {
      return fail(ctx, Error(ErrorCode::InvalidArgument, "no standard input to read the spec from"));
    }
    // Messages about a spec read from standard input name it "stdin".
    file_name = from_stdin ? "stdin" : options.file;
    auto read = from_stdin ? read_spec_stream(*options.in, limits.max_file_bytes)
                           : read_spec(options.file, limits.max_file_bytes);
    if (!read) return fail(ctx, read.error());
    text = std::move(*read);
    auto parsed = model::parse_job_spec_detailed(text, limits);
    bool any = false;
    for (const auto& p : parsed.problems) {
      if (flag_for(overrides, p.path)) continue;  // the flag replaces what was wrong
      ctx.err << p.format(file_name) << "\n";
      any = true;
    }
    if (any) return kExitUsage;
    if (overrides.empty()) return std::pair{std::move(text), std::move(*parsed.spec)};
  }
  std::string final_text = model::apply_spec_overrides(text, overrides, limits);
  auto parsed = model::parse_job_spec_detailed(final_text, limits);
  if (!parsed.problems.empty()) {
    for (const auto& p : parsed.problems) {
      auto flag = flag_for(overrides, p.path);
      // "--time: expected a duration ...", or "--nodes: resources.gpus: must be a multiple ..."
      // for a field the flag did not set but made wrong.
      const auto fields = overrides.fields();
      const bool flag_field = flag && std::any_of(fields.begin(), fields.end(), [&](const auto& f) {
                                return f.first == p.path && f.second == *flag;
                              });
      ctx.err << (flag ? *flag : file_name) << ": " << (p.path.empty() || flag_field ? "" : p.path + ": ")
              << p.message << "\n";
    }
    return kExitUsage;
  }
  return std::pair{std::move(final_text), std::move(*parsed.spec)};
}

std::variant<int, std::string> send_submission(CommandContext& ctx, const SubmitOptions& options) {
  std::string file_name;
  auto checked = load_spec(ctx, options, file_name);
  if (auto* code = std::get_if<int>(&checked)) return *code;
  auto& [text, spec] = std::get<1>(checked);
  if (auto warning = model::launcher_warning(spec)) ctx.err << "corral: warning: " << *warning << "\n";
  // As sbatch: the job takes this shell's environment (--export, else the spec's export:)
  // and starts where we are unless the spec names a workdir.
  model::ExportChoice choice = spec.export_env.value_or(model::ExportChoice{});
  if (options.export_env) {
    auto flag = model::parse_export_choice(*options.export_env, "--export");
    if (!flag) return fail(ctx, flag.error());
    choice = *flag;
  }
  auto exported = model::exported_environment(choice, options.environ, options.export_env ? "--export" : "export");
  if (!exported) return fail(ctx, exported.error());
  Json environment = Json::array();
  for (const auto& [k, v] : *exported) environment.push_back(Json::array({k, v}));
  const bool named_file = !options.file.empty() && options.file != "-";
  Json body{{"spec", text},
            {"file", named_file ? std::filesystem::path(options.file).filename().string() : file_name},
            {"dry_run", options.dry_run},
            {"environment", environment}};
  if (!options.submit_dir.empty()) body["submit_dir"] = options.submit_dir;
  // One key for this submission, the same on every retry of it: a submission whose answer
  // was lost is sent again and the coordinator answers with the job it made, not a second.
  ApiHeaders headers;
  if (!options.dry_run) headers.emplace_back(kIdempotencyKeyHeader, new_idempotency_key());
  auto r = ctx.api.call("POST", "/v1/jobs", body.dump(-1, ' ', false, Json::error_handler_t::replace), headers);
  if (!r) return fail(ctx, r.error());
  if (r->status == 400) {
    // The coordinator's parser may be newer than ours and find more.
    auto problems = parse_problems(r->body);
    if (problems.empty()) return fail(ctx, error_from_response(*r));
    for (const auto& p : problems) ctx.err << p << "\n";
    return kExitUsage;
  }
  const int expected = options.dry_run ? 200 : 201;
  if (r->status != expected) return fail(ctx, error_from_response(*r));
  return std::move(r->body);
}

int run_submit(CommandContext& ctx, const SubmitOptions& options) {
  auto sent = send_submission(ctx, options);
  if (auto* code = std::get_if<int>(&sent)) return *code;
  const std::string& answer = std::get<std::string>(sent);
  if (options.json) return print_json(ctx, answer);
  if (options.dry_run) {
    auto d = parse_dry_run(answer);
    if (!d) return fail(ctx, d.error());
    ctx.out << format_dry_run(*d);
    return kExitOk;
  }
  auto ids = parse_submitted_ids(answer);
  if (!ids) return fail(ctx, ids.error());
  if (options.parsable) {
    ctx.out << ids->front() << "\n";
  } else if (options.overrides.array || ids->size() > 1) {
    ctx.out << "Submitted array job " << ids->front() << " (" << ids->size() << " elements, jobs " << ids->front()
            << "-" << ids->back() << ")\n";
  } else {
    ctx.out << "Submitted job " << ids->front() << "\n";
  }
  return kExitOk;
}

namespace {

// GET path?query: a list of jobs, printed as JSON or through `format`.
int print_job_list(CommandContext& ctx, const std::string& path, const std::vector<std::string>& query, bool json,
                   std::string (*format)(const std::vector<JobInfo>&, TimePoint)) {
  auto body = call(ctx, "GET", query.empty() ? path : path + "?" + join(query, "&"));
  if (!body) return fail(ctx, body.error());
  if (json) return print_json(ctx, *body);
  auto jobs = parse_jobs(*body);
  if (!jobs) return fail(ctx, jobs.error());
  ctx.out << format(*jobs, ctx.clock.now());
  return kExitOk;
}

}  // namespace

int run_queue(CommandContext& ctx, const QueueOptions& options) {
  std::string target = "/v1/jobs";
  std::vector<std::string> query;
  if (options.all) query.push_back("all=1");
  if (!options.users.empty()) query.push_back("user=" + query_list(options.users));
  if (!options.states.empty()) query.push_back("state=" + query_list(options.states));
  if (options.me) query.push_back("me=1");
  return print_job_list(ctx, target, query, options.json, format_queue);
}

int run_history(CommandContext& ctx, const HistoryOptions& options) {
  std::vector<std::string> query;
  if (!options.since.empty()) query.push_back("since=" + net::percent_encode(options.since));
  if (!options.until.empty()) query.push_back("until=" + net::percent_encode(options.until));
  if (!options.users.empty()) query.push_back("user=" + query_list(options.users));
  if (!options.states.empty()) query.push_back("state=" + query_list(options.states));
  if (options.limit > 0) query.push_back("limit=" + std::to_string(options.limit));
  return print_job_list(ctx, "/v1/history", query, options.json, format_history);
}

int run_usage(CommandContext& ctx, const UsageOptions& options) {
  std::vector<std::string> query{"by=" + net::percent_encode(options.by)};
  if (!options.since.empty()) query.push_back("since=" + net::percent_encode(options.since));
  if (!options.until.empty()) query.push_back("until=" + net::percent_encode(options.until));
  auto body = call(ctx, "GET", "/v1/usage?" + join(query, "&"));
  if (!body) return fail(ctx, body.error());
  if (options.json) return print_json(ctx, *body);
  auto usage = parse_usage(*body);
  if (!usage) return fail(ctx, usage.error());
  ctx.out << format_usage(*usage);
  return kExitOk;
}

int run_show(CommandContext& ctx, const JobOptions& options) {
  auto body = call(ctx, "GET", job_path(options.job));
  if (!body) return fail(ctx, body.error());
  if (options.json) return print_json(ctx, *body);
  auto job = parse_job(*body);
  if (!job) return fail(ctx, job.error());
  ctx.out << format_job(*job, ctx.clock.now());
  return kExitOk;
}

int run_nodes(CommandContext& ctx, bool json, bool gpus) {
  // A line per node needs only each node's GPU classes: a tenth of the listing to read.
  auto body = call(ctx, "GET", gpus || json ? "/v1/nodes" : "/v1/nodes?gpus=classes");
  if (!body) return fail(ctx, body.error());
  if (json) return print_json(ctx, *body);
  auto nodes = parse_nodes(*body);
  if (!nodes) return fail(ctx, nodes.error());
  ctx.out << (gpus ? format_nodes(*nodes) : format_node_summary(*nodes));
  return kExitOk;
}

int run_cancel(CommandContext& ctx, const CancelOptions& options) {
  if (options.jobs.size() == 1 && options.users.empty() && options.states.empty()) {
    const std::string& id = options.jobs.front();
    auto body = call(ctx, "POST", job_path(id) + "/cancel");
    if (!body) return fail(ctx, body.error());
    if (options.json) return print_json(ctx, *body);
    auto job = parse_job(*body);
    if (!job) return fail(ctx, job.error());
    if (!job->array_cancelled.empty()) {
      ctx.out << "Cancelled array " << id << " (" << job->array_cancelled.size() << " live elements)\n";
      return kExitOk;
    }
    ctx.out << "Cancelled job " << id;
    // Ranks may still be stopping: say so rather than claim they are gone.
    if (job->state != "CANCELLED") ctx.out << " (state " << job->state << ")";
    ctx.out << "\n";
    return kExitOk;
  }
  // Many at once: one request, one commit, each job answered on its own.
  Json request = Json::object();
  if (!options.jobs.empty()) {
    request["ids"] = Json::array();
    // Plain ids as numbers; ARRAY_INDEX as text, for the coordinator to resolve.
    for (const auto& ref : options.jobs) {
      auto n = parse_int<std::int64_t>(ref);
      if (n) {
        request["ids"].push_back(*n);
      } else {
        request["ids"].push_back(ref);
      }
    }
  }
  if (!options.users.empty()) request["user"] = options.users;
  if (!options.states.empty()) request["state"] = options.states;
  auto body = call(ctx, "POST", "/v1/jobs/cancel", request.dump(-1, ' ', false, Json::error_handler_t::replace));
  if (!body) return fail(ctx, body.error());
  auto outcome = parse_bulk_cancel(*body);
  if (!outcome) return fail(ctx, outcome.error());
  if (options.json) {
    if (int rc = print_json(ctx, *body); rc != kExitOk) return rc;
  } else {
    for (const auto& [id, state] : outcome->cancelled) {
      ctx.out << "Cancelled job " << id << (state != "CANCELLED" ? " (state " + state + ")" : std::string()) << "\n";
    }
    if (outcome->cancelled.empty() && outcome->failed.empty()) ctx.out << "No job matched\n";
  }
  for (const auto& [id, message] : outcome->failed) ctx.err << "corral: " << message << "\n";
  return outcome->failed.empty() ? kExitOk : kExitFailed;
}

int run_wait(CommandContext& ctx, const WaitOptions& options) {
  const TimePoint start = ctx.clock.now();
  std::optional<TimePoint> deadline;
  if (options.timeout) deadline = start + *options.timeout;
  bool seen = false;
  // A plain flag and time, not an optional: GCC 12 misreads the optional as uninitialised.
  bool unreachable = false;
  TimePoint unreachable_since{};
  std::string last_state;
  for (;;) {
    // The coordinator holds the request until the job ends or `hold` passes (long poll),
    // so an ending job is seen at once without polling.
    const TimePoint asked = ctx.clock.now();
    Duration hold = kWaitHold;
    if (deadline) hold = std::min(hold, std::max(Duration::zero(), *deadline - asked));
    const auto hold_s = std::chrono::ceil<std::chrono::seconds>(hold);
    auto r = ctx.api.call("GET", job_path(options.job) + "?wait=" + std::to_string(hold_s.count()));
    if (!r) {
      const bool transient =
          r.error().code() == ErrorCode::Unavailable || r.error().code() == ErrorCode::Timeout;
      // A coordinator restarting under a long wait should not end it; one that was never
      // reached, or stays away, does.
      if (!seen || !transient) return fail(ctx, r.error());
      TimePoint now = ctx.clock.now();
      if (!unreachable) {
        unreachable = true;
        unreachable_since = now;
        ctx.err << "corral: " << r.error().message() << "; still waiting\n";
      }
      if (now - unreachable_since >= options.reconnect_patience) return fail(ctx, r.error());
    } else if (r->status != 200) {
      return fail(ctx, error_from_response(*r));
    } else {
      unreachable = false;
      auto job = parse_job(r->body);
      if (!job) return fail(ctx, job.error());
      seen = true;
      last_state = job->state;
      if (is_terminal_state(job->state)) {
        if (options.json) {
          if (int rc = print_json(ctx, r->body); rc != kExitOk) return rc;
        } else {
          ctx.out << format_end_state(*job) << "\n";
        }
        return wait_exit_code(*job);
      }
    }
    TimePoint now = ctx.clock.now();
    Duration pause = options.poll_interval;
    if (deadline) {
      if (now >= *deadline) {
        ctx.err << "corral: timed out after " << format_elapsed(now - start) << " waiting for job "
                << options.job << (last_state.empty() ? std::string() : " (still " + last_state + ")")
                << "\n";
        return kExitFailed;
      }
      pause = std::min(pause, *deadline - now);
    }
    // A held request that ran its course needs no pause; an early answer (the
    // coordinator unreachable or restarting) does, so this never spins.
    if (unreachable || now - asked < hold_s) ctx.sleep(pause);
  }
}

namespace {

// --follow on a job that has no ranks yet: waits until it has (0), or ends without
// starting (its exit code, having said how it ended).
std::optional<int> wait_for_ranks(CommandContext& ctx, const LogsOptions& options) {
  bool said = false;
  for (;;) {
    auto body = call(ctx, "GET", job_path(options.job));
    if (!body) return fail(ctx, body.error());
    auto job = parse_job(*body);
    if (!job) return fail(ctx, job.error());
    if (!job->ranks.empty()) return std::nullopt;
    if (is_terminal_state(job->state)) {
      ctx.err << "corral: " << format_end_state(*job) << " without starting\n";
      return wait_exit_code(*job);
    }
    if (!said) {
      ctx.err << "corral: job " << options.job << " is " << job->state
              << (job->reason.empty() ? std::string() : " (" + job->reason + ")") << "; waiting for it to start\n";
      said = true;
    }
    ctx.sleep(options.start_poll_interval);
  }
}

}  // namespace

int run_logs(CommandContext& ctx, const LogsOptions& options) {
  if (options.follow) {
    if (auto done = wait_for_ranks(ctx, options)) return *done;
  }
  std::uint64_t offset = 0;
  std::optional<std::uint64_t> initial_size;
  std::uint64_t cut = 0;
  std::string lost;
  // After the log, on stderr: what the log lacks, so that it is never taken for whole.
  auto done = [&] {
    if (cut > 0) {
      ctx.err << "corral: " << cut << " bytes were cut from the middle of this log (the node's rank_log_cap); "
              << "a line \"[corral: N bytes cut from this log]\" marks where\n";
    }
    if (!lost.empty()) ctx.err << "corral: output may be missing from this log: " << lost << "\n";
    return kExitOk;
  };
  for (;;) {
    auto body = call(ctx, "GET",
                     job_path(options.job) + "/logs?rank=" + std::to_string(options.rank) +
                         "&offset=" + std::to_string(offset));
    if (!body) return fail(ctx, body.error());
    auto chunk = parse_log_chunk(*body);
    if (!chunk) return fail(ctx, chunk.error());
    ctx.out.write(chunk->data.data(), static_cast<std::streamsize>(chunk->data.size()));
    ctx.out.flush();
    cut = std::max(cut, chunk->cut);
    if (!chunk->lost.empty()) lost = chunk->lost;
    // The answer says where its data starts; continue from there, not from our guess.
    const std::uint64_t next = chunk->offset + chunk->data.size();
    if (!options.follow) {
      // What was there when we asked, and no more: a busy log cannot keep us reading.
      if (!initial_size) initial_size = chunk->size;
      if (chunk->data.empty() || next >= *initial_size) return done();
    } else {
      if (chunk->finished && (chunk->data.empty() || next >= chunk->size)) return done();
      if (chunk->data.empty()) ctx.sleep(options.poll_interval);
    }
    offset = next;
  }
}

int run_stack(CommandContext& ctx, const StackOptions& options) {
  std::string target = job_path(options.job) + "/stack";
  if (options.rank) target += "?rank=" + std::to_string(*options.rank);
  auto body = call(ctx, "GET", target);
  if (!body) return fail(ctx, body.error());
  if (options.json) return print_json(ctx, *body);
  auto ranks = parse_stacks(*body);
  if (!ranks) return fail(ctx, ranks.error());
  ctx.out << format_stacks(*ranks);
  return kExitOk;
}

namespace {

int node_action(CommandContext& ctx, const NodeOptions& options, bool drain) {
  std::string body =
      drain ? Json{{"reason", options.reason}}.dump(-1, ' ', false, Json::error_handler_t::replace)
            : std::string();
  auto r = call(ctx, "POST",
                "/v1/nodes/" + net::percent_encode(options.node) + (drain ? "/drain" : "/resume"), body);
  if (!r) return fail(ctx, r.error());
  if (options.json) return print_json(ctx, *r);
  auto node = parse_node(*r);
  if (!node) return fail(ctx, node.error());
  ctx.out << format_node_state(*node) << "\n";
  return kExitOk;
}

}  // namespace

int run_drain(CommandContext& ctx, const NodeOptions& options) {
  return node_action(ctx, options, true);
}

int run_resume(CommandContext& ctx, const NodeOptions& options) {
  return node_action(ctx, options, false);
}

int run_clear(CommandContext& ctx, const NodeOptions& options) {
  auto r = call(ctx, "POST", "/v1/nodes/" + net::percent_encode(options.node) + "/clear");
  if (!r) return fail(ctx, r.error());
  if (options.json) return print_json(ctx, *r);
  Json doc = Json::parse(*r, nullptr, false);
  std::vector<std::string> ids;
  if (doc.is_object() && doc.contains("cleared") && doc["cleared"].is_array()) {
    for (const auto& j : doc["cleared"]) {
      if (j.is_object() && j.contains("id") && j["id"].is_number_integer()) ids.push_back(std::to_string(j["id"].get<long long>()));
    }
  }
  if (ids.empty()) {
    ctx.out << "No job was waiting for ranks on " << options.node << "\n";
  } else {
    std::string list;
    for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
    ctx.out << "Ranks on " << options.node << " declared dead; job(s) " << list << " no longer wait for them\n";
  }
  return kExitOk;
}

}  // namespace corral::cli
