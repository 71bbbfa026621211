#include "coordinator/sched/fair_share.hpp"

#include <cmath>

namespace corral::sched {

void FairShare::advance(Instant now, const std::unordered_map<std::string, int>& gpus_by_user) {
  if (!last_) {
    last_ = now;
    return;
  }
  if (now <= *last_) return;
  double dt = std::chrono::duration<double>(now - *last_).count();
  double half = std::chrono::duration<double>(half_life_).count();
  double decay = half > 0 ? std::exp2(-dt / half) : 0.0;
  for (auto it = usage_.begin(); it != usage_.end();) {
    it->second *= decay;
    // Forget users whose usage has decayed to nothing, so the map does not grow forever.
    if (it->second < 1e-3) {
      it = usage_.erase(it);
    } else {
      ++it;
    }
  }
  // GPU time used during the interval, itself decayed to its midpoint: a close enough
  // integral of a constant load for intervals far shorter than the half-life.
  double mid_decay = half > 0 ? std::exp2(-dt / (2 * half)) : 0.0;
  for (const auto& [user, gpus] : gpus_by_user) {
    if (gpus > 0) usage_[user] += gpus * dt * mid_decay;
  }
  last_ = now;
}

double FairShare::usage(const std::string& user) const {
  auto it = usage_.find(user);
  return it == usage_.end() ? 0.0 : it->second;
}

}  // namespace corral::sched
