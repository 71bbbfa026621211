#pragma once
// Job arrays in Slurm's syntax: "0-99%8", "1,3,5", "0-30:10", each item a number, a
// range, or a range with a step, and "%N" for the most elements running at once.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"

namespace corral::model {

inline constexpr int kMaxArrayIndex = 1'000'000;
inline constexpr std::size_t kMaxArrayElements = 10'000;

struct ArraySpec {
  std::vector<int> indices;  // ascending, without repeats
  int max_running = 0;       // 0: no limit

  bool operator==(const ArraySpec&) const = default;
};

// InvalidArgument with a message for the field ("must be ... got ...").
Result<ArraySpec> parse_array(std::string_view text);
// The indices as Slurm prints them: {3, 4, 5, 7} -> "3-5,7".
std::string format_indices(const std::vector<int>& indices);
// How squeue names an array's pending elements on one line: "42_[3-5,7%8]"; a single
// element without a limit is plainly "42_3". `indices` ascending, not empty.
std::string pending_array_ref(std::int64_t array, const std::vector<int>& indices, int max_running);

}  // namespace corral::model
