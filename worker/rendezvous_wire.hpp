#pragma once
// The tcp-check rendezvous on the wire: one text line each way, bounded, versioned by
// its first word. A peer sends a Hello; rank 0 answers every peer with one Reply: the sum
// (the barrier's release), why the peer or the job was refused, or that rank 0 gave up
// waiting, so that each peer can say why it failed instead of timing out in silence.
// Text so that `nc` can speak it when someone debugs a port by hand.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/core/error.hpp"

namespace corral::worker {

inline constexpr std::string_view kWireMagic = "corral-tcp-check/1";
// Both directions; a longer line is refused, not read on.
inline constexpr std::size_t kMaxLineBytes = 1024;

struct Hello {
  int rank = 0;
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
  std::int64_t job_id = 0;
  int attempt = 0;
  std::int64_t value = 0;  // this rank's contribution to the sum
};

struct Reply {
  enum class Kind { Ok, Refused, TimedOut };
  Kind kind = Kind::Ok;
  std::int64_t sum = 0;  // Ok
  std::string message;   // Refused, TimedOut: rank 0's reason
};

// Each ends in '\n'; the parsers take the line without it.
std::string format_hello(const Hello& hello);
[[nodiscard]] Result<Hello> parse_hello(std::string_view line);
// A message longer than a line allows is cut; newlines in it become spaces.
std::string format_reply(const Reply& reply);
[[nodiscard]] Result<Reply> parse_reply(std::string_view line);

}  // namespace corral::worker
