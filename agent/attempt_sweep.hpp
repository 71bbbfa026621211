#pragma once
// AttemptSweep: confirming that nothing of an attempt is left on the node before its GPUs
// and master port are given back. Every process group of the attempt (its ranks', and
// nccl-root's) must be empty, and no process may carry the attempt's CORRAL_JOB_ID,
// CORRAL_ATTEMPT and CORRAL_AGENT_ID (one that left its group by setsid or a double fork
// is found that way). What is found is SIGKILLed and looked for again shortly (SIGKILL is
// delivered asynchronously), up to a bound; what is still there then is reported.
// The group checks run on the loop (a kill(2) each); the sweep of /proc runs on a
// BlockingWork thread. A result that comes back after the sweep is destroyed is dropped.

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/time.hpp"

namespace corral::net {
class BlockingWork;
class EventLoop;
class Timer;
}  // namespace corral::net

namespace corral::agent {

struct SweepTarget {
  long long job = 0;
  int attempt = 0;
  std::string agent_id;  // CORRAL_AGENT_ID of the ranks this agent started
  // The attempt's process groups whose ids are still its own: a group's id stays ours
  // while its leader is not reaped, and after that until the group is first seen empty
  // (from then the kernel may give it to any new process). The sweep drops each group
  // the first time it finds it empty.
  std::vector<pid_t> groups;
  std::string proc = "/proc";  // procfs root (tests point it elsewhere)
  // How a process found by its environment is killed: SIGKILL (tests replace it).
  std::function<void(pid_t)> kill_process = [](pid_t pid) { ::kill(pid, SIGKILL); };
  // The gap between the looks after the first kFastTries (tests shorten it).
  std::chrono::milliseconds slow_look{500};
};

class AttemptSweep {
 public:
  // `before_look` runs on the loop before each look: the agent reaps there (a zombie
  // keeps its group alive until reaped). `done` gets "" once nothing is left, else what
  // survived ("group 812, pid 901"); called once.
  AttemptSweep(net::EventLoop& loop, net::BlockingWork& work, SweepTarget target, std::function<void()> before_look,
               std::function<void(std::string left)> done);
  ~AttemptSweep();
  AttemptSweep(const AttemptSweep&) = delete;
  AttemptSweep& operator=(const AttemptSweep&) = delete;

  void start();

  // Looks before giving up: 40, 5 ms then 50 ms apart (about 2 s), then 56 more
  // slow_look apart (28 s): a SIGKILLed process stuck in a driver call (a GPU context
  // being torn down) ends only when the call does, and the node is drained only for what
  // outlives all of them. The attempt's GPUs and port stay held meanwhile.
  static constexpr int kFastTries = 40;
  static constexpr int kTries = 96;

 private:
  void look(int tries);
  void on_swept(int tries, std::string left, const std::vector<pid_t>& killed);

  net::BlockingWork& work_;
  SweepTarget target_;
  std::function<void()> before_look_;
  std::function<void(std::string)> done_;
  std::unique_ptr<net::Timer> timer_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // results check it
};

}  // namespace corral::agent
