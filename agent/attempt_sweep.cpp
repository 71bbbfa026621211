#include "agent/attempt_sweep.hpp"

#include <csignal>

#include "agent/launcher.hpp"
#include "common/net/blocking_work.hpp"
#include "common/net/event_loop.hpp"

namespace corral::agent {

AttemptSweep::AttemptSweep(net::EventLoop& loop, net::BlockingWork& work, SweepTarget target,
                           std::function<void()> before_look, std::function<void(std::string left)> done)
    : work_(work),
      target_(std::move(target)),
      before_look_(std::move(before_look)),
      done_(std::move(done)),
      timer_(std::make_unique<net::Timer>(loop)) {}

AttemptSweep::~AttemptSweep() = default;

void AttemptSweep::start() { look(0); }

void AttemptSweep::look(int tries) {
  if (before_look_) before_look_();
  std::string left;
  std::erase_if(target_.groups, [](pid_t group) { return group <= 0 || !group_alive(group); });
  for (pid_t group : target_.groups) {
    signal_group(group, SIGKILL);
    left += (left.empty() ? "" : ", ") + std::string("group ") + std::to_string(group);
  }
  std::weak_ptr<bool> alive = alive_;
  work_.run(
      [job = target_.job, attempt = target_.attempt, agent_id = target_.agent_id, proc = target_.proc,
       kill = target_.kill_process] {
        std::vector<pid_t> killed = attempt_processes(job, attempt, agent_id, proc);
        for (pid_t pid : killed) kill(pid);
        return killed;
      },
      [this, alive, tries, left](const std::vector<pid_t>& killed) {
        if (alive.expired()) return;
        on_swept(tries, left, killed);
      });
}

void AttemptSweep::on_swept(int tries, std::string left, const std::vector<pid_t>& killed) {
  for (pid_t pid : killed) left += (left.empty() ? "" : ", ") + std::string("pid ") + std::to_string(pid);
  if (!left.empty() && tries + 1 < kTries) {
    const auto gap = tries == 0 ? std::chrono::milliseconds(5)
                     : tries + 1 < kFastTries ? std::chrono::milliseconds(50)
                                              : target_.slow_look;
    timer_->start(gap, [this, tries] { look(tries + 1); });
    return;
  }
  // Moved out first: `done` may destroy this sweep.
  auto done = std::move(done_);
  done(std::move(left));
}

}  // namespace corral::agent
