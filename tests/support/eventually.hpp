#pragma once
// Small helpers for tests that watch real processes.

#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace corral::testing {

// How much longer a latency bound may be in a sanitizer build (-O0, shadow memory, checked
// allocations): the bounds a user is promised are for the build they run, and the sanitizer
// run is there to find memory and thread errors, not to time them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr int kSanitizerSlowdown = 4;
#else
inline constexpr int kSanitizerSlowdown = 1;
#endif

// Polls `pred` until it holds or `timeout` passes. Only for what has no event to wait on:
// a process gone from /proc, a node's state.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The process runs (exists and is not a zombie waiting to be reaped).
inline bool running(int pid) {
  if (pid <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Jobs submitted with the first admin's token run as this Unix user on real agents.
inline std::string current_user() {
  const passwd* pw = ::getpwuid(::geteuid());
  return pw != nullptr ? pw->pw_name : "root";
}

}  // namespace corral::testing
