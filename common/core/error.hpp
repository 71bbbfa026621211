#pragma once
// Error and Result: every expected failure in corral is a value, never an exception.

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace corral {

enum class ErrorCode {
  InvalidArgument,
  NotFound,
  Conflict,
  Unavailable,
  ResourceExhausted,
  Timeout,
  PermissionDenied,
  Unauthenticated,
  Internal,
};

std::string_view to_string(ErrorCode code);

class [[nodiscard]] Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: message"
  std::string to_string() const;

  // Returns a copy whose message is "context: message".
  Error with_context(std::string_view context) const;

 private:
  ErrorCode code_;
  std::string message_;
};

template <typename T>
using Result = std::expected<T, Error>;

inline std::unexpected<Error> make_error(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error(code, std::move(message)));
}

}  // namespace corral
