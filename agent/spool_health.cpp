#include "agent/spool_health.hpp"

namespace corral::agent {
namespace {
std::string reason(const std::string& problem) {
  return problem.empty() ? std::string() : "spool cannot take rank logs: " + problem;
}
}  // namespace

bool SpoolHealth::launch_failed(const std::string& problem) {
  if (problem.empty() || reason(problem) == error_) return false;
  error_ = reason(problem);
  return true;
}

bool SpoolHealth::looked(const std::string& problem) {
  std::string now = reason(problem);
  if (now == error_) return false;
  error_ = std::move(now);
  return true;
}

void SpoolHealth::lost(model::JobId job, int attempt, int rank, std::string why) {
  lost_.insert_or_assign({job, attempt, rank}, std::move(why));
  // The oldest jobs' first: their logs are the least likely to be asked for.
  while (lost_.size() > kLostLogsRemembered) lost_.erase(lost_.begin());
}

std::string SpoolHealth::lost_why(model::JobId job, int attempt, int rank) const {
  auto it = lost_.find({job, attempt, rank});
  return it == lost_.end() ? std::string() : it->second;
}

std::vector<std::string> SpoolHealth::take_check_once() {
  std::vector<std::string> out;
  out.swap(check_once_);
  return out;
}

bool SpoolHealth::begin_look() {
  if (looking_) return false;
  looking_ = true;
  return true;
}

}  // namespace corral::agent
