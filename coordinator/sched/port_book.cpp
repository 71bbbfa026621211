#include "coordinator/sched/port_book.hpp"

namespace corral::sched {

std::optional<int> PortBook::lowest_free(std::string_view host, const model::PortRange& range,
                                         Instant now) const {
  auto it = hosts_.find(std::string(host));
  if (it == hosts_.end()) {
    if (range.first > range.last) return std::nullopt;
    return range.first;
  }
  const Host& h = it->second;
  for (int port = range.first; port <= range.last; ++port) {
    if (h.held.contains(port)) continue;
    auto busy = h.busy_until.find(port);
    if (busy != h.busy_until.end() && busy->second > now) continue;
    return port;
  }
  return std::nullopt;
}

bool PortBook::hold(std::string_view host, int port, model::JobId job) {
  auto it = hosts_[std::string(host)].held.try_emplace(port, Host::Holder{job, 0}).first;
  if (it->second.job != job) return false;
  ++it->second.holds;
  return true;
}

void PortBook::release(std::string_view host, int port, model::JobId job) {
  auto it = hosts_.find(std::string(host));
  if (it == hosts_.end()) return;
  auto held = it->second.held.find(port);
  if (held == it->second.held.end() || held->second.job != job) return;
  if (--held->second.holds <= 0) it->second.held.erase(held);
}

void PortBook::mark_busy(std::string_view host, int port, Instant until) {
  hosts_[std::string(host)].busy_until[port] = until;
}

std::optional<model::JobId> PortBook::holder(std::string_view host, int port) const {
  auto it = hosts_.find(std::string(host));
  if (it == hosts_.end()) return std::nullopt;
  auto held = it->second.held.find(port);
  if (held == it->second.held.end()) return std::nullopt;
  return held->second.job;
}

std::size_t PortBook::held_count() const {
  std::size_t n = 0;
  for (const auto& [_, h] : hosts_) n += h.held.size();
  return n;
}

}  // namespace corral::sched
