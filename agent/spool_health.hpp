#pragma once
// SpoolHealth: whether the spool can take the ranks' logs, and which ranks' logs may have
// lost output, as the agent's launches and its periodic log looks (log_cap) find them.
// The spool's trouble drains the node with its own reason, kept apart from preflight's so
// that one clearing does not hide the other; a lost log is said by corral logs. No I/O:
// it holds what the looks found. Lives on the agent's loop.

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/model/job.hpp"

namespace corral::agent {

class SpoolHealth {
 public:
  static constexpr std::size_t kLostLogsRemembered = 4096;

  // The drain reason ("spool cannot take rank logs: ..."), or "" while the spool takes them.
  const std::string& error() const { return error_; }
  // A launch could not make a rank's log (`problem`): true when the reason is new. Only a
  // look at the spool (looked) lifts it.
  bool launch_failed(const std::string& problem);
  // A look at the spool found `problem`, or "" for none: true when the reason changed.
  bool looked(const std::string& problem);

  // Why output may be missing from this rank's log ("" when nothing is known to be); the
  // newest kLostLogsRemembered are kept.
  void lost(model::JobId job, int attempt, int rank, std::string why);
  std::string lost_why(model::JobId job, int attempt, int rank) const;

  // The log of a rank that ended: looked at once more by the next look, then no more.
  void check_once(std::string log) { check_once_.push_back(std::move(log)); }
  std::vector<std::string> take_check_once();

  // One look at a time: false while one runs.
  bool begin_look();
  void end_look() { looking_ = false; }

 private:
  std::string error_;
  std::map<std::tuple<model::JobId, int, int>, std::string> lost_;
  std::vector<std::string> check_once_;
  bool looking_ = false;
};

}  // namespace corral::agent
