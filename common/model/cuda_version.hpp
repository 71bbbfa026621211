#pragma once
// A CUDA version as nvidia-smi prints it ("12.4") and as jobs ask for it (min_cuda).

#include <compare>
#include <optional>
#include <string>
#include <string_view>

namespace corral::model {

struct CudaVersion {
  int major = 0;
  int minor = 0;

  auto operator<=>(const CudaVersion&) const = default;
  std::string to_string() const { return std::to_string(major) + "." + std::to_string(minor); }
  // "12", "12.4"; nothing else.
  static std::optional<CudaVersion> parse(std::string_view text);
};

}  // namespace corral::model
