#include "agent/kill_escalation.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include "agent/launcher.hpp"
#include "common/net/event_loop.hpp"

namespace corral::agent {

KillEscalation::KillEscalation(net::EventLoop& loop, std::string what)
    : timer_(std::make_unique<net::Timer>(loop)), what_(std::move(what)) {}

KillEscalation::~KillEscalation() = default;

bool KillEscalation::start(const std::map<int, pid_t>& running, Duration grace) {
  cancel();
  int signal = grace.count() > 0 ? SIGTERM : SIGKILL;
  for (const auto& [rank, pid] : running) {
    if (signal_group(pid, signal)) left_[rank] = pid;
  }
  if (left_.empty()) return false;
  // No grace: SIGKILL went out already, and each rank's reaping ends the kill. A timer
  // would only report that ranks "ignored SIGTERM" that was never sent.
  if (signal == SIGKILL) {
    left_.clear();
    return true;
  }
  timer_->start(grace, [this] { deadline(); });
  return true;
}

void KillEscalation::exited(int rank) {
  left_.erase(rank);
  if (left_.empty()) timer_->cancel();
}

void KillEscalation::cancel() {
  timer_->cancel();
  left_.clear();
}

void KillEscalation::deadline() {
  for (const auto& [rank, pid] : left_) {
    spdlog::warn("{} rank {} ignored SIGTERM for the grace period: SIGKILL", what_, rank);
    signal_group(pid, SIGKILL);
  }
  left_.clear();
}

}  // namespace corral::agent
