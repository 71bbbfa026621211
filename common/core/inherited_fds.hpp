#pragma once
// Closing, in a child between fork and exec, every descriptor the parent did not mean to
// hand on: a job must never hold the agent's connection to the coordinator, its logs or
// its pipes (a rank once found the agent's WebSocket among its descriptors and shut it
// down). Every child the agent starts goes through this one helper.

namespace corral {

class InheritedFds {
 public:
  // Before the fork (it may read the descriptor limit): the last resort's bound.
  InheritedFds();

  // In the child, after fork and before exec: closes every descriptor above 2 but `keep`
  // (-1: none; a close-on-exec pipe that reports a failed exec, say). Async-signal-safe:
  // close_range(2) where the kernel has it (Linux 5.9), else the entries of /proc/self/fd
  // read with the raw getdents64 system call into a buffer on the stack, else every
  // number up to the limit read before the fork. Allocates nothing.
  void close_all_but(int keep = -1) const noexcept { close_all_but(keep, true); }
  // The same without trying close_range first: how a kernel before 5.9 is served (tests).
  void close_all_but(int keep, bool try_close_range) const noexcept;

 private:
  int limit_ = 1024;
};

}  // namespace corral
