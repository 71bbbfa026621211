#include "agent/outbox.hpp"

namespace corral::agent {

void Outbox::hold(std::string text) {
  ++made_;
  // Over the bound the oldest report goes, whichever list it is in: one sent on a link
  // that is closing (not yet lost) is older than anything held.
  if (held_.size() + unacked_.size() >= max_held_) {
    if (!unacked_.empty()) {
      unacked_.pop_front();
      ++acked_;  // so the connection's acknowledgement of it, should it come, moves nothing
    } else {
      held_.pop_front();
    }
    ++settled_;
  }
  held_.push_back(std::move(text));
}

void Outbox::acknowledged(std::uint64_t received) {
  while (acked_ < received && !unacked_.empty()) {
    unacked_.pop_front();
    ++acked_;
    ++settled_;
  }
}

void Outbox::link_lost() {
  held_.insert(held_.begin(), unacked_.begin(), unacked_.end());
  while (held_.size() > max_held_) {
    held_.pop_front();
    ++settled_;
  }
  unacked_.clear();
  acked_ = 0;
}

std::deque<std::string> Outbox::release() {
  std::deque<std::string> out;
  out.swap(held_);
  unacked_.insert(unacked_.end(), out.begin(), out.end());
  return out;
}

}  // namespace corral::agent
