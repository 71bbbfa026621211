// `corral run`: submit, wait for placement, stream every rank's output, exit with the
// job's code (as srun). Ctrl-C cancels the job; a second one within a second leaves it
// running instead.

#include <map>
#include <ostream>

#include "cli/commands.hpp"
#include "cli/exit_codes.hpp"
#include "cli/format.hpp"
#include "cli/views.hpp"
#include "common/core/strings.hpp"

namespace corral::cli {

namespace {

// One rank's log as it is followed: where to ask from, and the part of a line not yet
// printed (lines of different ranks are never mixed).
struct RankStream {
  std::uint64_t offset = 0;
  std::string partial;
  bool done = false;  // finished and drained, or unreadable once the job ended
};

class Runner {
 public:
  Runner(CommandContext& ctx, const RunOptions& options, std::int64_t id) : ctx_(ctx), options_(options), id_(id) {}

  int follow() {
    handled_interrupts_ = interrupts();
    for (;;) {
      if (interrupts() > handled_interrupts_) {
        if (auto code = on_interrupt()) return *code;
      }
      auto body = ctx_.api.call("GET", "/v1/jobs/" + std::to_string(id_));
      if (!body) return fail(body.error());
      if (body->status != 200) return fail(error_from_response(*body));
      auto job = parse_job(body->body);
      if (!job) return fail(job.error());
      if (job->ranks.empty()) {
        if (is_terminal_state(job->state)) return finish(*job);
        show_pending(*job);
        ctx_.sleep(options_.start_poll_interval);
        continue;
      }
      if (job->attempt != attempt_) start_attempt(*job);
      bool got_data = false;
      for (const auto& rank : job->ranks) {
        if (options_.rank && rank.rank != *options_.rank) continue;
        got_data |= read_some(rank.rank, is_terminal_state(job->state));
      }
      if (is_terminal_state(job->state) && all_done(*job)) return finish(*job);
      if (!got_data) ctx_.sleep(options_.poll_interval);
    }
  }

 private:
  int interrupts() const { return ctx_.interrupts ? ctx_.interrupts() : 0; }

  int fail(const Error& error) {
    clear_status();
    ctx_.err << "corral: " << error.message() << "\n";
    return exit_code_for(error);
  }

  // Ctrl-C: cancel in a second, unless a second Ctrl-C says to leave the job running.
  // nullopt: go on following (the cancelled job's end is still shown).
  std::optional<int> on_interrupt() {
    clear_status();
    if (cancel_sent_) {
      ctx_.err << "corral: no longer following job " << id_ << " (it is being cancelled)\n";
      return kExitInterrupted;
    }
    // The press that brought us here is handled_interrupts_ + 1; any after it, even one
    // that came before this line was printed, is the second.
    const int seen = handled_interrupts_ + 1;
    ctx_.err << "corral: cancelling job " << id_ << "; Ctrl-C again within 1 s leaves it running\n";
    for (Duration waited{}; waited < kSecondInterruptWindow; waited += kInterruptPoll) {
      ctx_.sleep(kInterruptPoll);
      if (interrupts() > seen) {
        ctx_.err << "corral: job " << id_ << " left running; follow it with `corral logs -f " << id_
                 << "`, stop it with `corral cancel " << id_ << "`\n";
        return kExitInterrupted;
      }
    }
    handled_interrupts_ = interrupts();
    cancel_sent_ = true;
    auto r = ctx_.api.call("POST", "/v1/jobs/" + std::to_string(id_) + "/cancel");
    if (!r) return fail(r.error());
    // 409: it ended meanwhile; its end is shown as any other.
    if (r->status != 200 && r->status != 409) return fail(error_from_response(*r));
    return std::nullopt;
  }

  // Why the job waits: a spinner on a terminal, else a line each time the reason changes.
  void show_pending(const JobInfo& job) {
    std::string why = job.state;
    if (!job.reason.empty()) why += " (" + job.reason + (job.detail.empty() ? "" : ": " + job.detail) + ")";
    if (ctx_.err_is_tty) {
      static constexpr const char* kFrames[] = {"|", "/", "-", "\\"};
      ctx_.err << "\r\033[K" << kFrames[spin_++ % 4] << " job " << id_ << " " << why << std::flush;
      status_shown_ = true;
    } else if (why != last_pending_) {
      ctx_.err << "corral: job " << id_ << " is " << why << "\n";
    }
    last_pending_ = why;
  }

  void clear_status() {
    if (!status_shown_) return;
    ctx_.err << "\r\033[K" << std::flush;
    status_shown_ = false;
  }

  // A new attempt (the first, or a retry) starts its logs from the beginning.
  void start_attempt(const JobInfo& job) {
    clear_status();
    if (attempt_ >= 0) {
      flush_partials();
      ctx_.err << "corral: job " << id_ << " attempt " << job.attempt << " started\n";
    } else if (!last_pending_.empty()) {
      ctx_.err << "corral: job " << id_ << " started on " << join(job.node_names(), ",") << "\n";
    }
    attempt_ = job.attempt;
    streams_.clear();
  }

  // Asks once for what is new in the rank's log; true when something came.
  bool read_some(int rank, bool job_ended) {
    RankStream& s = streams_[rank];
    if (s.done) return false;
    auto r = ctx_.api.call("GET", "/v1/jobs/" + std::to_string(id_) + "/logs?rank=" + std::to_string(rank) +
                                      "&offset=" + std::to_string(s.offset));
    if (!r || r->status != 200) {
      // A node whose agent is away may come back while the job runs; once it has ended,
      // what could not be read is said and left.
      if (job_ended) {
        flush(rank, s);
        ctx_.err << "corral: the output of rank " << rank << " cannot be read: "
                 << (r ? error_from_response(*r).message() : r.error().message()) << "\n";
        s.done = true;
      }
      return false;
    }
    auto chunk = parse_log_chunk(r->body);
    if (!chunk) {
      s.done = true;
      return false;
    }
    s.offset = chunk->offset + chunk->data.size();
    emit(rank, s, chunk->data);
    if (chunk->finished && s.offset >= chunk->size) {
      flush(rank, s);
      s.done = true;
    }
    return !chunk->data.empty();
  }

  // Whole lines only, each with its rank's label when asked.
  void emit(int rank, RankStream& s, const std::string& data) {
    s.partial += data;
    std::size_t start = 0;
    for (std::size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      line(rank, std::string_view(s.partial).substr(start, nl + 1 - start));
    }
    s.partial.erase(0, start);
    ctx_.out.flush();
  }

  void flush(int rank, RankStream& s) {
    if (s.partial.empty()) return;
    line(rank, s.partial + "\n");
    s.partial.clear();
    ctx_.out.flush();
  }

  void flush_partials() {
    for (auto& [rank, s] : streams_) flush(rank, s);
  }

  void line(int rank, std::string_view text) {
    if (!clear_done_) {
      clear_status();
      clear_done_ = true;
    }
    if (options_.label) ctx_.out << rank << ": ";
    ctx_.out << text;
  }

  bool all_done(const JobInfo& job) {
    for (const auto& rank : job.ranks) {
      if (options_.rank && rank.rank != *options_.rank) continue;
      if (!streams_[rank.rank].done) return false;
    }
    return true;
  }

  int finish(const JobInfo& job) {
    clear_status();
    flush_partials();
    if (job.state != "COMPLETED") ctx_.err << "corral: " << format_end_state(job) << "\n";
    return wait_exit_code(job);
  }

  static constexpr Duration kSecondInterruptWindow = std::chrono::seconds(1);
  static constexpr Duration kInterruptPoll = std::chrono::milliseconds(50);

  CommandContext& ctx_;
  const RunOptions& options_;
  std::int64_t id_;
  int handled_interrupts_ = 0;
  bool cancel_sent_ = false;
  int attempt_ = -1;
  std::map<int, RankStream> streams_;
  std::string last_pending_;
  unsigned spin_ = 0;
  bool status_shown_ = false;
  bool clear_done_ = false;
};

}  // namespace

int run_run(CommandContext& ctx, const RunOptions& options) {
  SubmitOptions submit = options.submit;
  submit.dry_run = false;
  {
    // One job to stay with: an array is many (submit it, then follow an element).
    std::string file_name;
    auto checked = load_spec(ctx, submit, file_name);
    if (auto* code = std::get_if<int>(&checked)) return *code;
    if (std::get<1>(checked).second.array) {
      ctx.err << "corral: run follows one job; an array is many: submit it, then `corral logs -f ARRAY_INDEX`\n";
      return kExitUsage;
    }
  }
  auto sent = send_submission(ctx, submit);
  if (auto* code = std::get_if<int>(&sent)) return *code;
  auto id = parse_submitted_id(std::get<std::string>(sent));
  if (!id) {
    ctx.err << "corral: " << id.error().message() << "\n";
    return exit_code_for(id.error());
  }
  return Runner(ctx, options, *id).follow();
}

}  // namespace corral::cli
