#pragma once
// Ending an attempt's ranks on a node: SIGTERM to each rank's process group, then, once
// the grace period is over, SIGKILL to the groups of the ranks that have not exited yet.
// With no grace, SIGKILL at once. Lives on the agent's loop; the timer never blocks.

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

#include "common/core/time.hpp"

namespace corral::net {
class EventLoop;
class Timer;
}  // namespace corral::net

namespace corral::agent {

class KillEscalation {
 public:
  // `what` names the attempt in the log ("job 12 attempt 1").
  KillEscalation(net::EventLoop& loop, std::string what);
  ~KillEscalation();
  KillEscalation(const KillEscalation&) = delete;
  KillEscalation& operator=(const KillEscalation&) = delete;

  // Signals the process group of every running rank (rank -> pid of its group leader).
  // False when none was left to signal: nothing will exit because of it.
  bool start(const std::map<int, pid_t>& running, Duration grace);
  // The rank was reaped: it is not killed at the deadline.
  void exited(int rank);
  void cancel();
  // Ranks still to be killed at the deadline.
  std::size_t waiting() const { return left_.size(); }

 private:
  void deadline();

  std::unique_ptr<net::Timer> timer_;
  std::string what_;
  std::map<int, pid_t> left_;
};

}  // namespace corral::agent
