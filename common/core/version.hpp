#pragma once
// The version every corral program prints for --version: the project's version from
// CMake, compiled into one file so that a version change rebuilds nothing else.

#include <string>

namespace corral {

// "0.1.0"
std::string version();
// "corral-agent 0.1.0"
std::string version_line(const std::string& program);

}  // namespace corral
