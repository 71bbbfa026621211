#pragma once
// A Prometheus histogram: counts of observations at or under each bound, their sum and
// count. Plain data; the coordinator renders it in /metrics.

#include <cstdint>
#include <string>
#include <vector>

namespace corral {

class Histogram {
 public:
  // `bounds` ascending; +Inf is implied.
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

  void observe(double value) {
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      if (value <= bounds_[i]) ++counts_[i];
    }
    sum_ += value;
    ++count_;
  }

  // The _bucket, _sum and _count lines of `name`, with `labels` ("a=\"b\"", or empty)
  // on each.
  std::string render(const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // cumulative, as Prometheus wants them
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

}  // namespace corral
