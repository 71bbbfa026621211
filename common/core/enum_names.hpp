#pragma once
// The value of an enum whose every value is listed in `all` and named by to_string(),
// from its name: the one parse for every such enum.

#include <cstddef>
#include <optional>
#include <string_view>

namespace corral {

template <typename E, std::size_t N>
std::optional<E> parse_enum_name(const E (&all)[N], std::string_view text) {
  for (E value : all) {
    if (to_string(value) == text) return value;
  }
  return std::nullopt;
}

}  // namespace corral
