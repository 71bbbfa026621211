#pragma once
// Tunables of the scheduling core, handed to its constructor; never a global.

#include <chrono>

#include "common/core/time.hpp"

namespace corral::sched {

struct SchedOptions {
  // Fair share: a user's recent GPU time halves every half-life.
  Duration fair_share_half_life = std::chrono::hours(24);
  // A port an agent found taken by a foreign process is not offered again for this long.
  Duration busy_port_hold = std::chrono::minutes(10);
  // Backfill: a later job may start ahead of the blocked head job only when that cannot
  // delay the head's earliest start.
  bool backfill = true;
};

}  // namespace corral::sched
