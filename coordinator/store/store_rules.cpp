#include "coordinator/store/store_rules.hpp"

#include <algorithm>
#include <set>
#include <unordered_map>

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

std::set<std::string> released_nodes(const JobRecord& job) {
  std::set<std::string> released;
  if (job.state != model::JobState::Ending) return released;
  std::unordered_map<std::string_view, bool> all_gone;  // per node with ranks
  for (const auto& r : job.ranks) {
    auto [it, added] = all_gone.try_emplace(r.node, true);
    it->second = it->second && r.gone;
  }
  for (const auto& [node, gone] : all_gone) {
    if (gone) released.emplace(node);
  }
  for (const auto& f : job.fences) {
    if (f.attempt == job.attempt) released.insert(f.node);
  }
  return released;
}

bool fold_job_update(Change& into, Change& next) {
  // The job a change updates, when it changes that job alone: its UpdateJob, then its events.
  auto sole_job = [](const Change& c) -> std::optional<model::JobId> {
    const auto* update = c.mutations.empty() ? nullptr : std::get_if<UpdateJob>(&c.mutations.front());
    if (update == nullptr) return std::nullopt;
    for (std::size_t i = 1; i < c.mutations.size(); ++i) {
      const auto* event = std::get_if<AppendEvent>(&c.mutations[i]);
      if (event == nullptr || event->event.job != update->job.id) return std::nullopt;
    }
    return update->job.id;
  };
  const auto job = sole_job(into);
  if (!job || job != sole_job(next)) return false;
  into.mutations.front() = std::move(next.mutations.front());
  for (std::size_t i = 1; i < next.mutations.size(); ++i) into.mutations.push_back(std::move(next.mutations[i]));
  next.mutations.clear();
  return true;
}

std::vector<GpuKey> gpus_held_by(const JobRecord& job) {
  std::vector<GpuKey> gpus;
  for (const auto& f : job.fences) {
    for (int index : f.gpus) gpus.push_back({f.node, index});
  }
  if (!model::holds_resources(job.state) || !job.allocation) return gpus;
  const std::set<std::string> released = released_nodes(job);
  for (const auto& node : job.allocation->nodes) {
    if (released.contains(node.node)) continue;
    for (int index : node.gpus) gpus.push_back({node.node, index});
  }
  return gpus;
}

std::vector<PortKey> ports_held_by(const JobRecord& job) {
  // Every fence holds its attempt's master port (its ranks may still connect to it), and a
  // job holding resources holds its own until it ends; several of them are one hold.
  std::set<PortKey> ports;
  for (const auto& f : job.fences) {
    if (f.port != 0) ports.insert({f.host, f.port});
  }
  // Port 0: the allocation has no master port yet, so there is nothing to hold.
  if (model::holds_resources(job.state) && job.allocation && job.allocation->master_port != 0) {
    ports.insert({job.allocation->master_addr, job.allocation->master_port});
  }
  return {ports.begin(), ports.end()};
}

Result<void> check_submit_key(const SubmitKey& key) {
  if (key.user.empty() || key.key.empty()) {
    return make_error(ErrorCode::InvalidArgument, "a submit key needs a user and a key");
  }
  if (key.jobs < 1) {
    return make_error(ErrorCode::InvalidArgument,
                      "a submit key must name at least one job, got " + std::to_string(key.jobs));
  }
  return {};
}

Error submit_key_exists_error(const SubmitKey& key) {
  return Error(ErrorCode::Conflict, "user " + key.user + "'s submit key is recorded already");
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
  if (holder == job) {
    return Error(ErrorCode::InvalidArgument, "port " + std::to_string(port.port) + " on host " + port.host +
                                                 " is listed twice for job " + std::to_string(job));
  }
  return Error(ErrorCode::Conflict, "port " + std::to_string(port.port) + " on host " + port.host +
                                        " is held by job " + std::to_string(holder) + ", not free for job " +
                                        std::to_string(job));
}

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

bool is_lower_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

}  // namespace

Result<void> check_user(const User& user) {
  constexpr std::size_t kMaxName = 64;
  if (user.name.empty() || user.name.size() > kMaxName ||
      !std::all_of(user.name.begin(), user.name.end(), is_name_char)) {
    // A bad name may be long or hold control characters: say what is wrong, not the name.
    return make_error(ErrorCode::InvalidArgument,
                      "user name must be 1 to 64 characters of [A-Za-z0-9._-] (got " +
                          std::to_string(user.name.size()) + " characters)");
  }
  if (user.token_hash.size() != 64 ||
      !std::all_of(user.token_hash.begin(), user.token_hash.end(), is_lower_hex)) {
    return make_error(ErrorCode::InvalidArgument,
                      "user " + user.name + ": token hash must be 64 lowercase hex characters (a SHA-256)");
  }
  return {};
}

Error token_taken_error(std::string_view holder, std::string_view user) {
  return Error(ErrorCode::Conflict,
               "user " + std::string(user) + ": that token already belongs to user " + std::string(holder));
}

bool cannot_write(const Error& error) {
  switch (error.code()) {
    case ErrorCode::Unavailable:        // I/O error, busy, cannot open
    case ErrorCode::ResourceExhausted:  // disk full
    case ErrorCode::PermissionDenied:   // read-only
      return true;
    default:
      return false;
  }
}

}  // namespace corral::store
