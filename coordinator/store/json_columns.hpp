#pragma once
// The JSON text stored in SqliteStore's allocation, gpus and ranks columns. nlohmann::json stays
// inside json_columns.cpp; callers see strings and model types only.

#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"
#include "common/model/inventory.hpp"
#include "common/model/job.hpp"
#include "coordinator/store/store.hpp"

namespace corral::store {

std::string allocation_to_json(const model::Allocation& allocation);
// InvalidArgument naming what is wrong when the text is not an allocation we wrote.
[[nodiscard]] Result<model::Allocation> allocation_from_json(std::string_view text);

std::string gpus_to_json(const std::vector<model::Gpu>& gpus);
[[nodiscard]] Result<std::vector<model::Gpu>> gpus_from_json(std::string_view text);

// A list of Fence.
std::string fences_to_json(const std::vector<Fence>& fences);
[[nodiscard]] Result<std::vector<Fence>> fences_from_json(std::string_view text);

// Environment variables as a list of [name, value] pairs.
std::string env_to_json(const model::EnvList& env);
[[nodiscard]] Result<model::EnvList> env_from_json(std::string_view text);

// A list of RankRecord; an absent exit code or signal is stored as null.
std::string ranks_to_json(const std::vector<RankRecord>& ranks);
[[nodiscard]] Result<std::vector<RankRecord>> ranks_from_json(std::string_view text);

}  // namespace corral::store
