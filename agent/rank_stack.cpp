#include "agent/rank_stack.hpp"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "agent/inventory/run_command.hpp"
#include "agent/launcher.hpp"
#include "agent/rank_watch.hpp"

namespace corral::agent {

namespace {

constexpr std::size_t kMaxProcesses = 16;
constexpr std::size_t kMaxThreads = 256;
constexpr std::size_t kMaxToolOutput = 256 * 1024;

std::string cpu_seconds(std::uint64_t ticks) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(ticks) / static_cast<double>(std::max(1L, ::sysconf(_SC_CLK_TCK))));
  return text;
}

void indent(std::string& out, const std::string& text, const std::string& prefix) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    out += prefix;
    out.append(text, at, end - at);
    out += '\n';
    at = end + 1;
  }
}

// One external tool's output, or why there is none.
std::string run_tool(const std::vector<std::string>& argv, Duration timeout) {
  auto r = run_command(argv, timeout, kMaxToolOutput);
  if (!r) return argv.front() + " failed: " + r.error().message() + "\n";
  std::string out = r->out;
  if (!r->succeeded()) {
    out += r->err;
    out += argv.front() + " exited with " + std::to_string(r->exit_code) + "\n";
  }
  return out;
}

std::vector<pid_t> threads_of(pid_t pid, const std::string& proc) {
  std::vector<pid_t> out;
  DIR* dir = ::opendir((proc + "/" + std::to_string(pid) + "/task").c_str());
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9') out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  if (out.size() > kMaxThreads) out.resize(kMaxThreads);
  return out;
}

}  // namespace

StackTools find_stack_tools(const std::string& path) {
  StackTools tools;
  tools.gdb = find_program("gdb", path);
  tools.py_spy = find_program("py-spy", path);
  return tools;
}

std::string rank_stack_report(pid_t group, const StackTools& tools) {
  auto members = group_members({group}, tools.proc);
  auto it = members.find(group);
  if (group <= 0 || it == members.end()) return "no process of the rank is running on this node\n";
  auto procs = it->second;
  std::sort(procs.begin(), procs.end(), [](const auto& a, const auto& b) { return a.pid < b.pid; });
  std::string out;
  if (procs.size() > kMaxProcesses) {
    out += std::to_string(procs.size()) + " processes; the first " + std::to_string(kMaxProcesses) + " shown\n";
    procs.resize(kMaxProcesses);
  }
  for (const auto& p : procs) {
    const std::string dir = tools.proc + "/" + std::to_string(p.pid);
    std::string wchan = read_wchan(dir);
    out += "process " + std::to_string(p.pid) + " (" + p.comm + ") " + describe_state(p.state) +
           (wchan.empty() ? "" : " in " + wchan) + ", " + cpu_seconds(p.cpu_ticks) + " s of CPU\n";
    for (pid_t tid : threads_of(p.pid, tools.proc)) {
      const std::string task = dir + "/task/" + std::to_string(tid);
      auto t = parse_proc_stat(tid, read_small_file(task + "/stat"));
      if (!t) continue;
      std::string twchan = read_wchan(task);
      out += "  thread " + std::to_string(tid) + " (" + t->comm + ") " + describe_state(t->state) +
             (twchan.empty() ? "" : " in " + twchan) + ", " + cpu_seconds(t->cpu_ticks) + " s of CPU\n";
    }
    if (std::string kernel = read_small_file(dir + "/stack"); !kernel.empty()) {
      out += "  kernel stack:\n";
      indent(out, kernel, "    ");
    }
    if (!tools.gdb.empty()) {
      out += "  native stacks (gdb):\n";
      indent(out,
             run_tool({tools.gdb, "-p", std::to_string(p.pid), "-batch", "-nx", "-ex", "set pagination off", "-ex",
                       "thread apply all bt"},
                      tools.timeout),
             "    ");
    } else {
      out += "  native stacks: gdb is not installed on this node\n";
    }
    if (p.comm.starts_with("python")) {
      if (!tools.py_spy.empty()) {
        out += "  Python stacks (py-spy):\n";
        indent(out, run_tool({tools.py_spy, "dump", "--pid", std::to_string(p.pid)}, tools.timeout), "    ");
      } else {
        out += "  Python stacks: py-spy is not on the agent's PATH\n";
      }
    }
    // A tool killed at its timeout may leave the stop it attached with pending: the
    // process goes on, unless it was stopped before we looked.
    if ((!tools.gdb.empty() || !tools.py_spy.empty()) && p.state != 'T' && p.state != 't') ::kill(p.pid, SIGCONT);
  }
  return out;
}

}  // namespace corral::agent
