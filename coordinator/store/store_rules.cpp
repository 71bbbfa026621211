#include "coordinator/store/store_rules.hpp"

namespace corral::store {

Result<void> check_job_record(const JobRecord& job) {
  if (job.id <= 0) {
    return make_error(ErrorCode::InvalidArgument, "job id must be positive, got " + std::to_string(job.id));
  }
  if (model::holds_resources(job.state) && !job.allocation) {
    return make_error(ErrorCode::InvalidArgument, "job " + std::to_string(job.id) + " is " +
                                                      std::string(model::to_string(job.state)) +
                                                      " but has no allocation");
  }
  return {};
}

std::vector<GpuKey> gpus_held_by(const JobRecord& job) {
  std::vector<GpuKey> gpus;
  if (!model::holds_resources(job.state) || !job.allocation) return gpus;
  for (const auto& node : job.allocation->nodes) {
    for (int index : node.gpus) gpus.push_back({node.node, index});
  }
  return gpus;
}

std::optional<PortKey> port_held_by(const JobRecord& job) {
  // Port 0: the allocation has no master port yet, so there is nothing to hold.
  if (!model::holds_resources(job.state) || !job.allocation || job.allocation->master_port == 0) {
    return std::nullopt;
  }
  return PortKey{job.allocation->master_addr, job.allocation->master_port};
}

Error job_exists_error(model::JobId id) {
  return Error(ErrorCode::Conflict, "job " + std::to_string(id) + " already exists");
}

Error job_not_found_error(model::JobId id, std::string_view action) {
  return Error(ErrorCode::NotFound, std::string(action) + ": job " + std::to_string(id) + " does not exist");
}

Error gpu_held_error(const GpuKey& gpu, model::JobId holder, model::JobId job) {
  std::string what = "GPU " + std::to_string(gpu.index) + " on node " + gpu.node;
  if (holder == job) {
    return Error(ErrorCode::InvalidArgument,
                 what + " appears twice in the allocation of job " + std::to_string(job));
  }
  return Error(ErrorCode::Conflict, what + " is held by job " + std::to_string(holder) +
                                        ", not free for job " + std::to_string(job));
}

Error port_held_error(const PortKey& port, model::JobId holder, model::JobId job) {
  return Error(ErrorCode::Conflict, "port " + std::to_string(port.port) + " on host " + port.host +
                                        " is held by job " + std::to_string(holder) + ", not free for job " +
                                        std::to_string(job));
}

Result<void> check_user(const User& user) {
  constexpr std::string_view kName = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
  if (user.name.empty() || user.name.size() > 64 || user.name.find_first_not_of(kName) != std::string::npos) {
    return make_error(ErrorCode::InvalidArgument, "user name must be 1 to 64 of [A-Za-z0-9._-], got \"" + user.name + "\"");
  }
  if (user.token_hash.size() != 64 || user.token_hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return make_error(ErrorCode::InvalidArgument, "user " + user.name + ": token hash must be 64 lowercase hex characters");
  }
  return {};
}

Error token_taken_error(const std::string& holder) {
  return Error(ErrorCode::Conflict, "that token already belongs to user " + holder);
}

}  // namespace corral::store
