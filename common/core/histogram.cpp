#include "common/core/histogram.hpp"

#include <cstdio>

namespace corral {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::string out;
  const std::string sep = labels.empty() ? "" : ",";
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    out += name + "_bucket{" + labels + sep + "le=\"" + number(bounds_[i]) + "\"} " + std::to_string(counts_[i]) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + braces + " " + number(sum_) + "\n";
  out += name + "_count" + braces + " " + std::to_string(count_) + "\n";
  return out;
}

}  // namespace corral
