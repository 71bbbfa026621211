#pragma once
// PortBook: which master ports are held, per host address. Two agents on one machine
// share an address and therefore its ports. Lives inside the Scheduler.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/core/time.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job.hpp"

namespace corral::sched {

class PortBook {
 public:
  // The lowest port of `range` on `host` that no live job holds and no agent reported
  // busy in the last `busy_hold`.
  std::optional<int> lowest_free(std::string_view host, const model::PortRange& range, Instant now) const;
  // False when another job already holds it. A job may hold a port more than once (its
  // allocation and the fences of its lost nodes); it is free after as many releases.
  bool hold(std::string_view host, int port, model::JobId job);
  void release(std::string_view host, int port, model::JobId job);
  void mark_busy(std::string_view host, int port, Instant until);
  std::optional<model::JobId> holder(std::string_view host, int port) const;
  std::size_t held_count() const;

 private:
  struct Host {
    struct Holder {
      model::JobId job = 0;
      int holds = 0;
    };
    std::map<int, Holder> held;
    std::map<int, Instant> busy_until;
  };
  std::unordered_map<std::string, Host> hosts_;
};

}  // namespace corral::sched
