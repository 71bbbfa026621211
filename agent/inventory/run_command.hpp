#pragma once
// Runs a short-lived program (nvidia-smi and the like) to completion and captures what
// it prints. Blocking: call it from a thread that may wait up to the timeout (the
// agent's BlockingWork), never from the event loop. Thread-safe.

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral::agent {

struct CommandOutput {
  // The exit status when the program exited; 128 + signal (as a shell reports it) when
  // a signal ended it.
  int exit_code = 0;
  int signal = 0;  // the signal that ended the program; 0 when it exited
  std::string out;
  std::string err;

  bool succeeded() const { return signal == 0 && exit_code == 0; }
  bool operator==(const CommandOutput&) const = default;
};

// Starts argv[0] (looked up in PATH when it has no '/') in its own process group, with
// stdin from /dev/null and no descriptors but 0-2 inherited, and reads stdout and
// stderr until both close and the program has exited. A background process that the
// program leaves behind holding its stdout counts as not finished.
//
// Errors: InvalidArgument for an empty argv; NotFound when the program does not exist;
// PermissionDenied when it may not be run; Timeout when it has not finished within
// `timeout` (its whole process group is then killed with SIGKILL); ResourceExhausted
// when stdout or stderr passes `max_output_bytes` (the group is killed too, so a runaway
// program cannot fill memory); Internal when a system call fails.
[[nodiscard]] Result<CommandOutput> run_command(const std::vector<std::string>& argv, Duration timeout,
                                                std::size_t max_output_bytes = std::size_t{1} << 20);

// Whether `pid` is a child that a run_command call in progress started and reaps itself.
// A process that reaps its other children with waitpid(-1) while run_command runs on
// another thread (the agent, a child subreaper) must leave these alone, or the command's
// exit status is lost. Waits while a call is starting its child, so that the answer holds
// for a child that has exited already.
bool run_command_owns(pid_t pid);

}  // namespace corral::agent
