#pragma once
// The NCCL bootstrap root of a job: ncclGetUniqueId opens the root's socket in the
// calling process, which must outlive the job's init, so it runs in `corral-worker
// nccl-root`, a child of the agent in its own process group. The child prints the ID as
// its first line on stdout and lives until its stdin closes or it is killed with the job.

#include <sys/types.h>

#include <string>

#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral::agent {

struct NcclRootChild {
  pid_t pid = 0;       // leads its own process group
  int stdin_fd = -1;   // closing it ends the child
  int id_fd = -1;      // the child's stdout: read the ID from it (read_nccl_root_id)
  std::string log_path;
};

// Starts `worker nccl-root` with a plain PATH and NCCL_SOCKET_IFNAME=`interface` (when
// set), its stderr appended to `log_path`. On the launch thread or the loop (one fork).
Result<NcclRootChild> start_nccl_root(const std::string& worker, const std::string& interface,
                                      const std::string& log_path);

// Off the loop: the unique ID the child prints on `fd` (closed here), checked to be 128
// bytes of hex; the wait is bounded by `timeout` in case the child hangs. Unavailable,
// with the first line of the child's log, when no valid ID came.
Result<std::string> read_nccl_root_id(int fd, const std::string& log_path, Duration timeout);

// A job's nccl-root child as the agent holds it, from its Prepare until the attempt ends.
// Released (the job ended, was killed, or was prepared again), it is killed outright,
// group and all: there is nothing to save in a bootstrap root. Its group is kept after
// that, for the sweep that confirms nothing of the attempt is left. On the agent's loop.
class NcclRootHold {
 public:
  // Takes the started child's pid and stdin (the ID pipe is the reader's).
  void hold(const NcclRootChild& child);
  // Whether the child was started and not released or reaped.
  bool running() const { return pid_ != 0; }
  // `pid` exited and was reaped: true when it was this child.
  bool reaped(pid_t pid);
  // Closes its stdin and SIGKILLs its group, unless it was reaped already.
  void release();
  // Once its leader is reaped, the group's id is ours only while a process is in it: the
  // first time it is found empty, the id is let go (group() is 0 from then on).
  void let_go_if_empty();
  // The leader of its process group while the id is ours (0: never started, or let go),
  // for the sweep.
  pid_t group() const { return group_; }

 private:
  pid_t pid_ = 0;
  pid_t group_ = 0;
  int stdin_fd_ = -1;
};

}  // namespace corral::agent
