#include "common/core/error.hpp"

namespace corral {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::NotFound: return "NotFound";
    case ErrorCode::Conflict: return "Conflict";
    case ErrorCode::Unavailable: return "Unavailable";
    case ErrorCode::ResourceExhausted: return "ResourceExhausted";
    case ErrorCode::Timeout: return "Timeout";
    case ErrorCode::PermissionDenied: return "PermissionDenied";
    case ErrorCode::Unauthenticated: return "Unauthenticated";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

std::string Error::to_string() const {
  std::string out(corral::to_string(code_));
  out += ": ";
  out += message_;
  return out;
}

Error Error::with_context(std::string_view context) const {
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Error(code_, std::move(msg));
}

}  // namespace corral
