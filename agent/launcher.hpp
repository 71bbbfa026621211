#pragma once
// Starting and stopping processes for ranks: fork and exec in a new process group, as
// the job's Unix user, with stdout and stderr in a log file and no other descriptor of
// the agent (InheritedFds). An exec that fails reports
// why through a close-on-exec pipe, so a bad user, workdir or command is an error here
// and not a mystery exit code. Called on the agent's launch thread: the only thread
// that looks users up (NSS keeps locks a forked child could inherit held) and forks
// ranks; glibc's fork keeps malloc usable in the child.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/core/error.hpp"

namespace corral::agent {

struct UserIds {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::string shell;
};

// NotFound when the user does not exist on this node.
Result<UserIds> lookup_user(const std::string& name);
Result<UserIds> lookup_user_id(uid_t uid);

// The PATH a rank starts with before its exported environment and env (a login's).
inline constexpr const char* kLoginPath = "/usr/local/bin:/usr/bin:/bin";

struct ProcessSpec {
  std::vector<std::string> argv;   // argv[0] is looked up on the PATH of `envp`
  std::vector<std::string> envp;   // "KEY=VALUE"
  std::string workdir;             // empty: `home`
  std::string home;                // empty: the user's home when switching, else stay where the agent is
  std::optional<UserIds> user;     // switch to this user (needs root)
  std::string log_path;            // stdout and stderr are appended here
  int stdout_fd = -1;              // when set: stdout goes here instead (the log keeps stderr)
  int stdin_fd = -1;               // when set: the child's stdin; else /dev/null
  // A program that must be found on the PATH of `envp` before exec, else the start fails
  // ("command not found"): the first word of a shell command (shell_program).
  std::string require_program;
};

// The program a `/bin/sh -c` command runs first, when that is plain to see: its first
// word, unless that is a shell keyword or builtin, an assignment, or holds quoting,
// expansions or other shell syntax. Empty otherwise.
std::string shell_program(std::string_view command);

// Where exec would find `program` on `path` (a PATH value); empty when nowhere.
std::string find_program(const std::string& program, const std::string& path);

// The pid of the started process, which leads its own process group. InvalidArgument
// with the reason when it could not be started ("workdir /data: No such file or
// directory", "command not found: trian.py (PATH=/usr/bin:/bin)").
Result<pid_t> spawn(const ProcessSpec& spec);

// Sends `signal` to the whole process group led by `pgid`. False when none is left.
bool signal_group(pid_t pgid, int signal);
// Whether any process of the group still exists.
bool group_alive(pid_t pgid);

// The variable that names the agent that started a rank; with CORRAL_JOB_ID and
// CORRAL_ATTEMPT it tells which processes are left of an attempt on this node (two agents
// on one machine, or two clusters, run ranks of the same job id and attempt).
inline constexpr const char* kAgentIdVariable = "CORRAL_AGENT_ID";

// Processes whose environment carries CORRAL_JOB_ID=`job`, CORRAL_ATTEMPT=`attempt` and
// CORRAL_AGENT_ID=`agent_id`: what is left of an attempt, also processes that left their
// rank's process group (setsid, double fork). Reads /proc/PID/environ (the agent runs as
// root); skips the calling process. `proc` is the procfs root (tests point it elsewhere).
std::vector<pid_t> attempt_processes(long long job, int attempt, const std::string& agent_id,
                                     const std::string& proc = "/proc");

// The start time of a process (field 22 of /proc/PID/stat), to tell a pid from a reused
// one; empty when there is no such process.
std::string process_start_time(pid_t pid);

// "exited with code 3" / "killed by signal 9 (Killed)" from a waitpid status.
std::string describe_status(int status);

}  // namespace corral::agent
