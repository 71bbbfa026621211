#pragma once
// FairShare: each user's recent GPU time, decaying with a half-life. Lower usage goes
// first among jobs of equal priority. Lives inside the Scheduler.

#include <optional>
#include <string>
#include <unordered_map>

#include "common/core/time.hpp"

namespace corral::sched {

class FairShare {
 public:
  explicit FairShare(Duration half_life) : half_life_(half_life) {}

  // Moves time to `now`: decays every usage and adds the GPU time of the jobs running
  // since the last call (gpus held per user over that interval).
  void advance(Instant now, const std::unordered_map<std::string, int>& gpus_by_user);
  // Decayed GPU-seconds.
  double usage(const std::string& user) const;
  void set_usage(const std::string& user, double gpu_seconds) { usage_[user] = gpu_seconds; }

 private:
  Duration half_life_;
  std::optional<Instant> last_;
  std::unordered_map<std::string, double> usage_;
};

}  // namespace corral::sched
