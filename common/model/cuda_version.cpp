#include "common/model/cuda_version.hpp"

#include "common/core/strings.hpp"

namespace corral::model {

namespace {
std::optional<int> parse_component(std::string_view text) {
  if (text.size() > 4) return std::nullopt;
  auto value = parse_int<int>(text);
  if (!value || *value < 0) return std::nullopt;
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
