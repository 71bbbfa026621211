#pragma once
// JSON for model values shared by the agent protocol and the HTTP API. Include only
// from .cpp files (brings nlohmann/json).

#include "common/model/inventory.hpp"
#include "common/model/job.hpp"
#include "common/protocol/json_reader.hpp"

namespace corral::protocol {

inline constexpr std::size_t kMaxName = 256;
inline constexpr std::size_t kMaxGpus = 64;

Json to_json(const model::Gpu& gpu);
Json to_json(const model::Allocation& alloc);
Json to_json(const model::Command& command);

model::Gpu gpu_from_json(const Json& j, const std::string& path, JsonReader& parent);
std::vector<model::Gpu> gpus_from_json(JsonReader& r, const char* key);
model::Allocation allocation_from_json(const Json& j, const std::string& path, JsonReader& parent);
model::Command command_from_json(JsonReader& r, const char* key);

}  // namespace corral::protocol
