#pragma once
// Outbox: the agent's reports (rank started, rank exited, attempt gone, ...) on their way
// to the coordinator, kept until it acknowledges them. A report sent on a link that then
// drops is sent again, first, on the next one; a report made while no link is up waits
// for it (up to a bound: the oldest go first). Acknowledgements count the reports of one
// connection. Reports leave in the order they came: the n-th report made is settled
// (acknowledged, or dropped over the bound) once settled() >= n. Plain state, on the
// agent's loop thread.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace corral::agent {

class Outbox {
 public:
  explicit Outbox(std::size_t max_held = 100000) : max_held_(max_held) {}

  // Sent now on a welcomed link: kept until acknowledged.
  void sent(std::string text) {
    unacked_.push_back(std::move(text));
    ++made_;
  }
  // No link to send it on: kept for the next one.
  void hold(std::string text);
  // The coordinator has committed the first `received` reports of this connection.
  void acknowledged(std::uint64_t received);
  // The link dropped: what it did not acknowledge goes out first next time.
  void link_lost();
  // A new link is welcomed: everything held, oldest first, to send now (each one then
  // counts as sent on this connection).
  std::deque<std::string> release();

  std::size_t held() const { return held_.size(); }
  std::size_t unacknowledged() const { return unacked_.size(); }
  // Reports made so far, and how many of the first ones are settled.
  std::uint64_t made() const { return made_; }
  std::uint64_t settled() const { return settled_; }

 private:
  std::size_t max_held_;
  std::deque<std::string> held_;
  std::deque<std::string> unacked_;
  std::uint64_t acked_ = 0;  // reports of this connection acknowledged so far
  std::uint64_t made_ = 0;
  std::uint64_t settled_ = 0;
};

}  // namespace corral::agent
