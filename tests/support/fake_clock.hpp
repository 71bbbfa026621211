#pragma once
// A Clock that stands still until the test moves it.

#include "common/core/time.hpp"

namespace corral::testing {

class FakeClock : public Clock {
 public:
  TimePoint now() const override { return now_; }
  void advance(Duration d) { now_ += d; }

 private:
  TimePoint now_ = from_millis(1'800'000'000'000);
};

}  // namespace corral::testing
