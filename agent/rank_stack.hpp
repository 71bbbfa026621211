#pragma once
// `corral stack`: one report per rank, gathered on its node, of where each process of the
// rank's group is: its /proc state, wait channel and CPU time, each thread's, the kernel
// stack where readable; the native stacks of every thread (gdb, when installed) and the
// Python stacks (py-spy, when on PATH). Runs external programs: called off the loop.

#include <sys/types.h>

#include <string>

#include "common/core/time.hpp"

namespace corral::agent {

struct StackTools {
  std::string gdb;     // the gdb to run; empty: none installed
  std::string py_spy;  // the py-spy to run; empty: none
  Duration timeout = std::chrono::seconds(5);  // for each run of either
  std::string proc = "/proc";
};

// The tools as found on `path` (the agent's PATH).
StackTools find_stack_tools(const std::string& path);

// The report for a rank whose process group is `group` (0: none running).
std::string rank_stack_report(pid_t group, const StackTools& tools);

}  // namespace corral::agent
