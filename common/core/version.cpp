#include "common/core/version.hpp"

namespace corral {

std::string version() { return CORRAL_VERSION; }

std::string version_line(const std::string& program) { return program + " " + version(); }

}  // namespace corral
