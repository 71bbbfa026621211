#pragma once
// TempDir: a fresh directory under the test temp dir, removed with everything in it when
// the test ends.

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace corral::store::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "corral-store-XXXXXX";
    char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) ADD_FAILURE() << "mkdtemp " << pattern << " failed";
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace corral::store::testing
