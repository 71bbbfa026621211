#pragma once
// Spool: the agent's folder on disk, which outlives the agent process. It holds each
// rank's log and, beside it, how the rank ended (`rank-R.log.exit`); a marker per running
// rank (`running/JOB-ATTEMPT-RANK`: pid, start time and the UUIDs of the rank's GPUs),
// kept until the coordinator has
// acknowledged the rank's end, so that the next agent process finds what this one left or
// did not get to report; and the agent's id. Plain file operations, safe on any
// thread; the paths are fixed at construction.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/core/error.hpp"
#include "common/model/job.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

class Spool {
 public:
  explicit Spool(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string attempt_dir(model::JobId job, int attempt) const;
  std::string log_path(model::JobId job, int attempt, int rank) const;

  // Creates the folders; Unavailable naming the folder when it cannot.
  Result<void> create() const;
  // Creates a rank's log before the rank starts, and makes sure the spool can take what it
  // writes (a block reserved, or room left where that cannot be asked):
  // ResourceExhausted with the system's reason (no space, no quota, an I/O error) when it
  // cannot, so that a job never runs with its output going nowhere.
  Result<void> create_log(model::JobId job, int attempt, int rank) const;
  // Why the spool cannot take writes now (less than kMinFree bytes free for the users that
  // ranks run as), or "" when it can.
  std::string full() const;
  static constexpr std::uint64_t kMinFree = std::uint64_t{1} << 20;
  // The id kept in the spool, made (and written atomically) on first use.
  Result<std::string> agent_id() const;

  // A rank about to start (pid 0) or started: its marker names its pid, the pid's start
  // time and the rank's GPUs (so that the next agent can tell whether anything still holds
  // them before it lets them go, survey or no survey).
  void mark_running(model::JobId job, int attempt, int rank, pid_t pid,
                    const std::vector<std::string>& gpu_uuids = {}) const;
  static std::string marker_name(model::JobId job, int attempt, int rank);
  // Removes the marker of that name (from marker_name or a Leftover).
  void forget(const std::string& marker) const;

  // How a rank ended, kept beside its log so that an agent restarted before the report
  // was acknowledged can still say it.
  void record_exit(const protocol::RankExited& m) const;
  // How a rank ended, as record_exit kept it; nullopt when nothing was recorded.
  std::optional<protocol::RankExited> recorded_exit(model::JobId job, int attempt, int rank) const;
  // A rank of an attempt that was launched here before: how it ended, from the spool.
  protocol::RankExited ended_before(model::JobId job, int attempt, int rank) const;
  // Whether this rank was ever started here (its log exists).
  bool started_before(model::JobId job, int attempt, int rank) const;

  // The markers an earlier agent process left: ranks it started and whose end the
  // coordinator had not acknowledged. Each stays until forgotten.
  struct Leftover {
    model::JobId job = 0;
    int attempt = 0;
    int rank = 0;
    bool named = false;   // the marker's name parsed as JOB-ATTEMPT-RANK
    std::string marker;   // the marker's file name
    pid_t pid = 0;
    std::string start_time;
    std::vector<std::string> gpu_uuids;  // none in a marker written before they were kept
  };
  std::vector<Leftover> leftovers() const;

 private:
  std::string marker_path(model::JobId job, int attempt, int rank) const;

  std::string root_;
};

}  // namespace corral::agent
