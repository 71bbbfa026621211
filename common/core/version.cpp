#include "common/core/version.hpp"

namespace corral {

std::string version_line(const std::string& program) {
  return program + " " + CORRAL_VERSION;
}

}  // namespace corral
