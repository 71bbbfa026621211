#pragma once
// A Clock that stands still until the test moves it. advance() is time passing (both
// clocks move); step() is the wall clock set forward or back (the monotonic one stays).

#include "common/core/time.hpp"

namespace corral::testing {

class FakeClock : public Clock {
 public:
  TimePoint now() const override { return now_.wall; }
  Instant mono() const override { return now_.mono; }
  void advance(Duration d) { now_ += d; }
  void step(Duration d) { now_.wall += d; }

 private:
  Now now_{from_millis(1'800'000'000'000), instant_from_millis(5'000'000)};
};

}  // namespace corral::testing
