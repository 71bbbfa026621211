#pragma once
// The JSON text stored in SqliteStore's allocation and gpus columns. nlohmann::json stays
// inside json_columns.cpp; callers see strings and model types only.

#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job.hpp"

namespace corral::store {

std::string allocation_to_json(const model::Allocation& allocation);
// InvalidArgument naming what is wrong when the text is not an allocation we wrote.
[[nodiscard]] Result<model::Allocation> allocation_from_json(std::string_view text);

std::string gpus_to_json(const std::vector<model::Gpu>& gpus);

struct RankRecord;
std::string ranks_to_json(const std::vector<RankRecord>& ranks);
[[nodiscard]] Result<std::vector<RankRecord>> ranks_from_json(std::string_view text);
[[nodiscard]] Result<std::vector<model::Gpu>> gpus_from_json(std::string_view text);

}  // namespace corral::store
