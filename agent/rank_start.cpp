#include "agent/rank_start.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "agent/launcher.hpp"
#include "agent/rank_env.hpp"

namespace corral::agent {

namespace {

// Every rank of the launch fails alike (no such user, root refused, no spool folder).
StartOutcome all_failed(const protocol::Launch& m, const std::string& reason) {
  StartOutcome out;
  for (const auto& r : m.ranks) {
    out.reports.emplace_back(protocol::RankExited{m.job, m.attempt, r.rank, 127, 0, reason, true});
  }
  return out;
}

}  // namespace

StartOutcome start_ranks(const StartContext& context, const protocol::Launch& m, int probe_fd) {
  struct CloseProbe {
    int& fd;
    ~CloseProbe() {
      if (fd >= 0) ::close(fd);
    }
  } close_probe{probe_fd};
  std::optional<UserIds> user;
  if (::geteuid() == 0) {
    auto u = lookup_user(m.user);
    if (!u) return all_failed(m, u.error().message());
    if (u->uid == 0 && !context.allow_root_jobs) {
      return all_failed(m, "jobs as root are refused on this node (allow_root_jobs: false)");
    }
    if (u->uid != 0) user = *u;
  }
  std::error_code ec;
  std::string dir = context.spool.attempt_dir(m.job, m.attempt);
  std::filesystem::create_directories(dir, ec);
  if (ec) return all_failed(m, "cannot create " + dir + ": " + ec.message());
  // A clean login-like environment, never the agent's own: the job's exported
  // environment and env come on top of it (build_rank_env).
  std::optional<UserIds> account = user;
  if (!account) {
    if (auto self = lookup_user_id(::geteuid())) account = *self;
  }
  Env base;
  base.emplace_back("PATH", kLoginPath);
  if (account) {
    base.emplace_back("HOME", account->home);
    base.emplace_back("USER", account->name);
    base.emplace_back("LOGNAME", account->name);
    base.emplace_back("SHELL", account->shell);
  }
  auto ranks = m.ranks;
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  StartOutcome out;
  for (const auto& r : ranks) {
    if (context.spool.started_before(m.job, m.attempt, r.rank)) {
      // This rank was started here before, by this agent process or an earlier one (a
      // Launch sent again after the coordinator lost our reports): never twice. Say how
      // it ended, as far as the spool knows.
      out.reports.emplace_back(context.spool.ended_before(m.job, m.attempt, r.rank));
      continue;
    }
    ProcessSpec spec;
    spec.argv = m.command.shell ? std::vector<std::string>{"/bin/sh", "-c", m.command.argv.front()} : m.command.argv;
    if (m.command.shell) spec.require_program = shell_program(m.command.argv.front());
    Env env = build_rank_env(m, r, {context.interface}, base);
    env.emplace_back(kAgentIdVariable, context.agent_id);
    spec.envp = to_envp(env);
    spec.workdir = m.workdir;
    if (account) spec.home = account->home;
    spec.user = user;
    spec.log_path = context.spool.log_path(m.job, m.attempt, r.rank);
    if (r.rank == 0 && probe_fd >= 0) {
      // Rank 0 binds the master port itself now.
      ::close(probe_fd);
      probe_fd = -1;
    }
    // The log made, and room for it, before anything runs: output written into a full
    // spool would be lost without a word.
    if (auto made = context.spool.create_log(m.job, m.attempt, r.rank); !made) {
      out.spool_problem = made.error().message();
      out.reports.emplace_back(
          protocol::RankExited{m.job, m.attempt, r.rank, 127, 0, "cannot start: " + made.error().message(), true});
      continue;
    }
    // Marked before it starts: an agent SIGKILLed between the fork and the pid's marker
    // leaves a marker all the same, and the next agent looks for the attempt's processes.
    std::vector<std::string> uuids;
    for (int g : r.gpus) {
      if (auto u = context.gpu_uuids.find(g); u != context.gpu_uuids.end()) uuids.push_back(u->second);
    }
    context.spool.mark_running(m.job, m.attempt, r.rank, 0, uuids);
    auto pid = spawn(spec);
    if (!pid) {
      // A bad workdir or command fails every rank alike: report it as the launch failure.
      // The marker stays until the coordinator has the report (an agent killed before
      // then leaves it, and the .exit record, to the next one).
      out.reports.emplace_back(protocol::RankExited{
          m.job, m.attempt, r.rank, 127, 0,
          "cannot start as user " + (user ? user->name : m.user) + ": " + pid.error().message(), true});
      continue;
    }
    context.spool.mark_running(m.job, m.attempt, r.rank, *pid, uuids);
    out.started.push_back(StartedRank{r.rank, *pid, spec.log_path, r.gpus, uuids});
    out.reports.emplace_back(protocol::RankStarted{m.job, m.attempt, r.rank, *pid});
  }
  return out;
}

}  // namespace corral::agent
