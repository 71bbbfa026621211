#include "common/model/cuda_version.hpp"

#include <charconv>

namespace corral::model {

namespace {
std::optional<int> parse_component(std::string_view text) {
  if (text.empty() || text.size() > 4) return std::nullopt;
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}
}  // namespace

std::optional<CudaVersion> CudaVersion::parse(std::string_view text) {
  auto dot = text.find('.');
  auto major = parse_component(text.substr(0, dot));
  if (!major) return std::nullopt;
  if (dot == std::string_view::npos) return CudaVersion{*major, 0};
  auto minor = parse_component(text.substr(dot + 1));
  if (!minor) return std::nullopt;
  return CudaVersion{*major, *minor};
}

}  // namespace corral::model
