#pragma once
// What every target shares: the input as text, and the first byte as a selector for
// targets that drive several parsers.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace corral::fuzz {

inline std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace corral::fuzz
