#include "cli/format.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "common/core/strings.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job_array.hpp"

namespace corral::cli {

namespace {

// C0 controls, DEL and the UTF-8 encoded C1 controls (U+0080-U+009F, which include a
// single-character CSI) become '?'.
std::string clean(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    auto u = static_cast<unsigned char>(text[i]);
    if (u == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) < 0xA0 &&
        static_cast<unsigned char>(text[i + 1]) >= 0x80) {
      out += '?';
      ++i;
    } else if (u < 0x20 || u == 0x7f) {
      out += '?';
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string cell(std::string_view text) {
  return text.empty() ? std::string("-") : clean(text);
}

// Display width of UTF-8 text: code points, not bytes ("×" is one column). East Asian
// wide characters are rare enough in job names to ignore.
std::size_t width(std::string_view text) {
  std::size_t w = 0;
  for (char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++w;
  }
  return w;
}

// Left-aligned columns two spaces apart; the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  // Each row rendered, the header first, with `indent` in front and no newline.
  std::vector<std::string> lines(std::string_view indent = "") const {
    std::vector<std::size_t> widths;
    for (const auto& row : rows_) {
      if (widths.size() < row.size()) widths.resize(row.size(), 0);
      for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], width(row[i]));
    }
    std::vector<std::string> out;
    for (const auto& row : rows_) {
      std::string line(indent);
      for (std::size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) line += std::string(widths[i] - width(row[i]) + 2, ' ');
      }
      out.push_back(std::move(line));
    }
    return out;
  }

  std::string render(std::string_view indent = "") const {
    std::string out;
    for (const auto& line : lines(indent)) out += line + "\n";
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string join_ints(const std::vector<int>& items) {
  std::vector<std::string> parts;
  for (int i : items) parts.push_back(std::to_string(i));
  return join(parts, ",");
}

std::string signal_name(int signal) {
  static constexpr std::array<std::pair<int, const char*>, 10> kNames = {{{1, "SIGHUP"},
                                                                          {2, "SIGINT"},
                                                                          {4, "SIGILL"},
                                                                          {6, "SIGABRT"},
                                                                          {7, "SIGBUS"},
                                                                          {8, "SIGFPE"},
                                                                          {9, "SIGKILL"},
                                                                          {11, "SIGSEGV"},
                                                                          {13, "SIGPIPE"},
                                                                          {15, "SIGTERM"}}};
  for (const auto& [number, name] : kNames) {
    if (number == signal) return name;
  }
  return "SIG" + std::to_string(signal);
}

std::string nodes_cell(const JobInfo& job) {
  auto names = job.node_names();
  if (job.state != "PENDING" && !names.empty()) return clean(join(names, ","));
  return std::to_string(job.nodes);
}

std::string master(const JobInfo& job) {
  if (job.master_addr.empty()) return "-";
  return clean(job.master_addr) + ":" +
         (job.master_port ? std::to_string(*job.master_port) : std::string("?"));
}

}  // namespace

std::string format_elapsed(Duration d) {
  long long total = std::chrono::duration_cast<std::chrono::seconds>(d).count();
  if (total < 0) total = 0;
  long long days = total / 86400;
  long long hours = total / 3600 % 24;
  long long minutes = total / 60 % 60;
  long long seconds = total % 60;
  char buf[64];
  if (days > 0) {
    std::snprintf(buf, sizeof(buf), "%lld-%02lld:%02lld:%02lld", days, hours, minutes, seconds);
  } else if (hours > 0) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", hours, minutes, seconds);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", minutes, seconds);
  }
  return buf;
}

std::string format_time_limit(const std::optional<double>& seconds) {
  if (!seconds || !std::isfinite(*seconds)) return "UNLIMITED";
  // Clamped so that an absurd value cannot overflow the conversion.
  double s = std::clamp(*seconds, 0.0, 1e12);
  return format_elapsed(std::chrono::seconds(static_cast<long long>(s)));
}

bool is_terminal_state(std::string_view state) {
  return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
         state == "NODE_FAIL";
}

Duration job_run_time(const JobInfo& job, TimePoint now) {
  auto started = parse_rfc3339(job.started_at);
  if (!started) return Duration(0);
  auto ended = parse_rfc3339(job.ended_at);
  TimePoint end = ended ? *ended : now;
  return std::max(Duration(0), end - *started);
}

std::string job_ref(const JobInfo& job) {
  if (!job.array_job) return std::to_string(job.id);
  return std::to_string(*job.array_job) + "_" + std::to_string(job.array_index);
}

std::string format_queue(const std::vector<JobInfo>& jobs, TimePoint now) {
  Table t({"ID", "NAME", "USER", "STATE", "REASON", "NODES", "GPUS", "TIME", "TIME_LIMIT"});
  // As squeue: an array's pending elements on one line, 42_[3-99%8], where its first is.
  std::map<std::int64_t, std::vector<int>> pending_of;
  for (const auto& job : jobs) {
    if (job.array_job && job.state == "PENDING") pending_of[*job.array_job].push_back(job.array_index);
  }
  std::set<std::int64_t> shown;
  for (const auto& job : jobs) {
    std::string id = job_ref(job);
    if (job.array_job && job.state == "PENDING") {
      if (!shown.insert(*job.array_job).second) continue;
      id = model::pending_array_ref(*job.array_job, pending_of.at(*job.array_job), job.array_max_running);
    }
    t.add({id, cell(job.name), cell(job.user), cell(job.state), cell(job.reason), nodes_cell(job),
           std::to_string(job.gpus), format_elapsed(job_run_time(job, now)), format_time_limit(job.time_limit_s)});
  }
  return t.render();
}

std::string format_history(const std::vector<JobInfo>& jobs, TimePoint now) {
  Table t({"ID", "NAME", "USER", "STATE", "REASON", "EXIT", "NODES", "GPUS", "ELAPSED", "ENDED"});
  for (const auto& job : jobs) {
    std::string exit = job.exit_code ? std::to_string(*job.exit_code) : "-";
    if (job.failed_rank) exit += " (rank " + std::to_string(*job.failed_rank) + ")";
    t.add({job_ref(job), cell(job.name), cell(job.user), cell(job.state), cell(job.reason), exit,
           nodes_cell(job), std::to_string(job.gpus), format_elapsed(job_run_time(job, now)), cell(job.ended_at)});
  }
  return t.render();
}

std::string format_usage(const UsageInfo& usage) {
  // Where usage is private the total is the caller's, not the cluster's: say so.
  std::string out = std::string(usage.own_only ? "GPU-hours of your own jobs" : "GPU-hours") + " from " +
                    clean(usage.since) + " to " + clean(usage.until) + "\n";
  std::string key = usage.by;
  for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  Table t({key, "GPU_HOURS", "JOBS"});
  char buf[32];
  for (const auto& row : usage.rows) {
    std::snprintf(buf, sizeof(buf), "%.2f", row.gpu_hours);
    t.add({cell(row.key), buf, std::to_string(row.jobs)});
  }
  std::snprintf(buf, sizeof(buf), "%.2f", usage.total_gpu_hours);
  t.add({"TOTAL", buf, ""});
  return out + t.render();
}

std::string format_job(const JobInfo& job, TimePoint now) {
  std::vector<std::pair<std::string, std::string>> fields;
  fields.emplace_back("ID", std::to_string(job.id) + (job.array_job ? " (array element " + job_ref(job) + ")" : ""));
  fields.emplace_back("Name", cell(job.name));
  fields.emplace_back("User", cell(job.user));
  fields.emplace_back("State", cell(job.state) + (job.state == "ENDING" && !job.outcome.empty()
                                                      ? " (" + cell(job.outcome) + " once every rank is gone)"
                                                      : std::string()));
  fields.emplace_back("Reason", cell(job.reason));
  if (!job.detail.empty()) fields.emplace_back("Detail", clean(job.detail));
  fields.emplace_back("Attempt", std::to_string(job.attempt));
  fields.emplace_back("Retries", std::to_string(job.retries));
  fields.emplace_back("Priority", std::to_string(job.priority));
  auto names = job.node_names();
  fields.emplace_back("Nodes", std::to_string(job.nodes) + (job.state != "PENDING" && !names.empty()
                                                                ? " (" + clean(join(names, ",")) + ")"
                                                                : std::string()));
  fields.emplace_back("GPUs", std::to_string(job.gpus));
  fields.emplace_back("Time limit", format_time_limit(job.time_limit_s));
  fields.emplace_back("Submitted", cell(job.submitted_at));
  fields.emplace_back("Started", cell(job.started_at));
  fields.emplace_back("Ended", cell(job.ended_at));
  if (!job.started_at.empty()) fields.emplace_back("Run time", format_elapsed(job_run_time(job, now)));
  fields.emplace_back("Master", master(job));
  if (!job.dependencies.empty()) {
    std::vector<std::string> deps;
    for (const auto& [kind, id] : job.dependencies) deps.push_back(clean(kind) + " " + std::to_string(id));
    fields.emplace_back("Depends on", join(deps, ", "));
  }
  if (job.failed_rank) {
    fields.emplace_back("Failed rank",
                        std::to_string(*job.failed_rank) +
                            (job.failed_node.empty() ? std::string() : " on " + clean(job.failed_node)));
  }
  if (job.exit_code) fields.emplace_back("Exit code", std::to_string(*job.exit_code));
  if (job.state == "ENDING") {
    // Which ranks hold the job's GPUs: not yet confirmed dead by their agents.
    std::vector<std::string> waiting;
    for (const auto& k : job.ranks) {
      if (k.gone) continue;
      bool alive = k.state == "PENDING" || k.state == "RUNNING";
      waiting.push_back(std::to_string(k.rank) + " on " + clean(k.node) + (alive ? " (running)" : ""));
    }
    if (!waiting.empty()) fields.emplace_back("Waiting for", "ranks " + join(waiting, ", ") + " to be confirmed gone");
  }
  // A job that ended before any look saw a rank check in (one that takes milliseconds)
  // has nothing to say about its rendezvous.
  const bool live = job.state == "STARTING" || job.state == "RUNNING";
  const bool rendezvous_shown = job.rendezvous && job.rendezvous->ranks > 0 && (live || job.rendezvous->joined > 0);
  if (rendezvous_shown) {
    const auto& rv = *job.rendezvous;
    if (rv.complete_after_ms) {
      fields.emplace_back("Rendezvous", "complete after " + std::to_string(*rv.complete_after_ms) + " ms (all " +
                                            std::to_string(rv.ranks) + " ranks checked in)");
    } else if (!rv.waiting_for.empty() && live) {
      std::vector<std::string> waiting;
      for (const auto& [rank, node] : rv.waiting_for) waiting.push_back(std::to_string(rank) + " (" + clean(node) + ")");
      fields.emplace_back("Rendezvous", "waiting for ranks " + join(waiting, ", ") + ", " + std::to_string(rv.joined) +
                                            " of " + std::to_string(rv.ranks) + " joined" +
                                            (rv.timeout_s > 0 ? "; deadline " + format_duration(Duration(static_cast<std::int64_t>(rv.timeout_s * 1000))) + " after the start"
                                                              : std::string()));
    } else if (live) {
      fields.emplace_back("Rendezvous", std::to_string(rv.joined) + " of " + std::to_string(rv.ranks) + " ranks checked in");
    } else {
      // Ended: a rank that checked in and ended between two looks was never seen doing so.
      fields.emplace_back("Rendezvous", std::to_string(rv.joined) + " of " + std::to_string(rv.ranks) +
                                            " ranks seen checking in before the job ended (the agents look every 200 ms)");
    }
  }
  // Held until the lost node's agent confirms, or an admin clears it (corral nodes --clear).
  for (const auto& f : job.fences) fields.emplace_back("Fenced", clean(f) + ": not confirmed dead");

  std::size_t key_width = 0;
  for (const auto& [key, value] : fields) key_width = std::max(key_width, key.size() + 1);
  std::string out;
  for (const auto& [key, value] : fields)
    out += key + ":" + std::string(key_width - key.size() + 1, ' ') + value + "\n";

  out += "\n";
  if (job.ranks.empty()) {
    out += "Ranks: none started\n";
  } else {
    // JOINED (when a rank checked in, after the job's start) only where the rendezvous is watched.
    const bool watched = rendezvous_shown;
    std::vector<std::string> header{"RANK", "NODE", "LOCAL", "GPUS", "UUIDS", "PID", "STATE", "EXIT"};
    if (watched) header.emplace_back("JOINED");
    Table ranks(std::move(header));
    auto started = parse_rfc3339(job.started_at);
    for (const auto& k : job.ranks) {
      std::string exit = k.exit_code ? std::to_string(*k.exit_code) : k.signal ? signal_name(*k.signal) : "-";
      std::vector<std::string> row{std::to_string(k.rank), cell(k.node), std::to_string(k.local_rank),
                                   cell(join_ints(k.gpus)), cell(join(k.gpu_uuids, ",")),
                                   k.pid ? std::to_string(*k.pid) : "-", cell(k.state), exit};
      if (watched) {
        std::string joined = "-";
        if (auto at = parse_rfc3339(k.joined_at); at && started) joined = "+" + std::to_string((*at - *started).count()) + " ms";
        row.push_back(std::move(joined));
      }
      ranks.add(std::move(row));
    }
    out += ranks.render();
    bool any = false;
    for (const auto& k : job.ranks) {
      for (const auto& w : k.warnings) {
        if (!any) out += "\nWarnings:\n";
        any = true;
        out += "  rank " + std::to_string(k.rank) + " on " + clean(k.node) + ": " + clean(w) + "\n";
      }
    }
  }
  if (!job.events.empty()) {
    out += "\nEvents:\n";
    for (const auto& e : job.events) out += "  " + cell(e.at) + "  " + clean(e.text) + "\n";
  }
  return out;
}

namespace {

// The node's reason, and for a node whose agent is away or silent but not lost yet, since
// when and until when its jobs are taken for running.
std::string node_reason(const NodeInfo& n) {
  if (n.silent_since.empty() || n.state == "down") return n.reason;
  std::string silence = "agent silent since " + n.silent_since;
  if (!n.lost_at.empty()) silence += ", lost at " + n.lost_at;
  return n.reason.empty() ? silence : n.reason + "; " + silence;
}

}  // namespace

std::string format_node_summary(const std::vector<NodeInfo>& nodes) {
  Table table({"NAME", "STATE", "GPUS", "USED", "CLASS", "ADDRESS", "SIMULATED", "REASON"});
  for (const auto& n : nodes) {
    int gpus = 0;
    int used = 0;
    std::vector<std::string> classes;
    for (const auto& c : n.gpu_classes) {
      gpus += c.count;
      used += c.used;
      std::string text = clean(model::GpuClass{c.name, c.memory_mib, c.driver}.to_string());
      classes.push_back(n.gpu_classes.size() == 1 ? text : std::to_string(c.count) + " × " + text);
    }
    if (n.gpu_classes.empty() && !n.gpus.empty()) {
      // A coordinator from before gpu_classes lists each GPU instead.
      gpus = static_cast<int>(n.gpus.size());
      used = static_cast<int>(std::count_if(n.gpus.begin(), n.gpus.end(), [](const GpuInfo& g) { return g.held; }));
      classes.push_back("(see --gpus)");
    }
    table.add({cell(n.name), cell(n.state), std::to_string(gpus), std::to_string(used),
               cell(join(classes, "; ")), cell(n.address), n.simulated ? "yes" : "no", cell(node_reason(n))});
  }
  return table.render();
}

std::string format_nodes(const std::vector<NodeInfo>& nodes) {
  Table node_table({"NAME", "STATE", "REASON", "ADDRESS", "GPUS", "SIMULATED"});
  Table gpu_table({"GPU", "PRODUCT", "MEMORY", "DRIVER", "CUDA", "JOB"});
  for (const auto& n : nodes) {
    node_table.add({cell(n.name), cell(n.state), cell(node_reason(n)), cell(n.address),
                    std::to_string(n.gpus.size()), n.simulated ? "yes" : "no"});
    for (const auto& g : n.gpus) {
      gpu_table.add({std::to_string(g.index), cell(g.name), std::to_string(g.memory_mib) + " MiB",
                     cell(g.driver), cell(g.cuda), g.job ? std::to_string(*g.job) : g.held ? "held" : "-"});
    }
  }
  // Both tables are aligned on their own, then interleaved: each node's GPUs under it.
  auto node_lines = node_table.lines();
  auto gpu_lines = gpu_table.lines("    ");
  std::string out = node_lines[0] + "\n";
  std::size_t next_gpu = 1;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    out += node_lines[i + 1] + "\n";
    if (nodes[i].gpus.empty()) continue;
    out += gpu_lines[0] + "\n";
    for (std::size_t g = 0; g < nodes[i].gpus.size(); ++g) out += gpu_lines[next_gpu++] + "\n";
  }
  return out;
}

std::string format_dry_run(const DryRunInfo& d) {
  if (d.would_start) {
    std::vector<std::string> placed;
    for (const auto& [node, gpus] : d.allocation) placed.push_back(clean(node) + "[" + join_ints(gpus) + "]");
    std::string out = "Dry run: the job would start now (nothing was submitted)\n";
    out += "  nodes:   " + (placed.empty() ? std::string("-") : join(placed, ",")) + "\n";
    out += "  master:  " + (d.master_addr.empty() ? std::string("-") : clean(d.master_addr)) + ":" +
           (d.master_port ? std::to_string(*d.master_port) : std::string("?")) + "\n";
    return out;
  }
  std::string out = "Dry run: the job would wait (nothing was submitted)\n";
  out += "  reason:  " + cell(d.reason) + "\n";
  if (!d.detail.empty()) out += "  detail:  " + clean(d.detail) + "\n";
  return out;
}

std::string format_end_state(const JobInfo& job) {
  std::string out = "Job " + std::to_string(job.id) + " " + cell(job.state);
  if (job.state == "COMPLETED") return out;
  if (!job.reason.empty()) out += " (" + clean(job.reason) + ")";
  std::vector<std::string> parts;
  if (job.failed_rank) {
    parts.push_back("rank " + std::to_string(*job.failed_rank) +
                    (job.failed_node.empty() ? std::string() : " on " + clean(job.failed_node)));
  }
  if (job.exit_code) parts.push_back("exit code " + std::to_string(*job.exit_code));
  if (!job.detail.empty()) parts.push_back(clean(job.detail));
  if (!parts.empty()) out += ": " + join(parts, ", ");
  return out;
}

std::string format_node_state(const NodeInfo& node) {
  std::string out = "Node " + cell(node.name) + " is " + cell(node.state);
  if (!node.reason.empty()) out += " (" + clean(node.reason) + ")";
  return out;
}

std::string format_stacks(const std::vector<RankStackInfo>& ranks) {
  std::string out;
  for (const auto& r : ranks) {
    out += "==== rank " + std::to_string(r.rank) + " on " + clean(r.node) + " ====\n";
    // Line by line: the report's newlines stay, any other control character does not.
    std::size_t at = 0;
    while (at < r.report.size()) {
      std::size_t end = r.report.find('\n', at);
      if (end == std::string::npos) end = r.report.size();
      out += clean(std::string_view(r.report).substr(at, end - at)) + "\n";
      at = end + 1;
    }
  }
  return out;
}

}  // namespace corral::cli
