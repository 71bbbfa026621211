#include "common/model/job_array.hpp"

#include <algorithm>

#include "common/core/strings.hpp"

namespace corral::model {

namespace {

Error bad(std::string_view text, const std::string& why) {
  return Error(ErrorCode::InvalidArgument,
               why + " (write indices like \"0-99%8\", \"1,3,5\" or \"0-30:10\"), got " + quote_for_message(text));
}

}  // namespace

Result<ArraySpec> parse_array(std::string_view text) {
  ArraySpec spec;
  std::string_view list = text;
  if (auto pct = text.find('%'); pct != std::string_view::npos) {
    auto limit = parse_int<int>(text.substr(pct + 1));
    if (!limit || *limit < 1) return std::unexpected(bad(text, "the most running at once (after %) must be a positive integer"));
    spec.max_running = *limit;
    list = text.substr(0, pct);
  }
  if (list.empty()) return std::unexpected(bad(text, "no indices"));
  for (const auto& item : split(list, ',')) {
    std::string_view range = item;
    int step = 1;
    if (auto colon = range.find(':'); colon != std::string_view::npos) {
      auto s = parse_int<int>(range.substr(colon + 1));
      if (!s || *s < 1) return std::unexpected(bad(text, "a step (after :) must be a positive integer"));
      step = *s;
      range = range.substr(0, colon);
    }
    auto dash = range.find('-', 0);
    auto first = parse_int<int>(range.substr(0, dash));
    auto last = dash == std::string_view::npos ? first : parse_int<int>(range.substr(dash + 1));
    if (!first || !last || *first < 0 || *last > kMaxArrayIndex) {
      return std::unexpected(bad(text, "indices must be integers from 0 to " + std::to_string(kMaxArrayIndex)));
    }
    if (*last < *first) return std::unexpected(bad(text, "a range must not run backwards"));
    for (long long i = *first; i <= *last; i += step) {
      spec.indices.push_back(static_cast<int>(i));
      if (spec.indices.size() > kMaxArrayElements) {
        return std::unexpected(bad(text, "an array holds at most " + std::to_string(kMaxArrayElements) + " elements"));
      }
    }
  }
  std::sort(spec.indices.begin(), spec.indices.end());
  spec.indices.erase(std::unique(spec.indices.begin(), spec.indices.end()), spec.indices.end());
  return spec;
}

std::string format_indices(const std::vector<int>& indices) {
  std::string out;
  for (std::size_t i = 0; i < indices.size();) {
    std::size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(indices[i]);
    if (j > i) out += "-" + std::to_string(indices[j]);
    i = j + 1;
  }
  return out;
}

std::string pending_array_ref(std::int64_t array, const std::vector<int>& indices, int max_running) {
  std::string ref = std::to_string(array) + "_";
  if (indices.size() == 1 && max_running <= 0) return ref + std::to_string(indices.front());
  return ref + "[" + format_indices(indices) + (max_running > 0 ? "%" + std::to_string(max_running) : "") + "]";
}

}  // namespace corral::model
