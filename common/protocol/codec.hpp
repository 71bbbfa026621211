#pragma once
// JSON codec of the agent protocol. Decoding checks every field's type and bound and
// names the field it rejects; nothing from the wire can crash the caller.

#include <string>
#include <string_view>

#include "common/core/error.hpp"
#include "common/protocol/messages.hpp"

namespace corral::protocol {

inline constexpr std::size_t kMaxMessageBytes = 8 * 1024 * 1024;

std::string encode(const AgentMessage& message);
std::string encode(const CoordinatorMessage& message);
Result<AgentMessage> decode_agent_message(std::string_view text);
Result<CoordinatorMessage> decode_coordinator_message(std::string_view text);

std::string_view type_name(const AgentMessage& message);
// Whether an agent message that did not decode is one the agent counts as a report
// (is_report), going by its "type"; true when even that cannot be read.
bool counts_as_report(std::string_view text);
// Whether `text` is a heartbeat exactly as encode() writes it: the message a coordinator
// gets most (one per node and second), read without building its JSON. Another spelling
// of a heartbeat decodes as any message does.
bool is_encoded_heartbeat(std::string_view text);
std::string_view type_name(const CoordinatorMessage& message);

}  // namespace corral::protocol
