#pragma once
// Reads the recorded nvidia-smi outputs under tests/unit/agent/data/.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace corral::agent::test_data {

inline std::filesystem::path data_dir() {
  return std::filesystem::path(CORRAL_SOURCE_DIR) / "tests" / "unit" / "agent" / "data";
}

// The file's bytes; empty when it is missing (the test then fails on what it expects).
inline std::string read_data(const std::string& relative) {
  std::ifstream in(data_dir() / relative, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace corral::agent::test_data
