#include "coordinator/store/memory_store.hpp"

#include <algorithm>
#include <set>
#include <tuple>

namespace corral::store {

std::vector<Result<void>> MemoryStore::commit(std::span<const Change> changes) {
  std::vector<Result<void>> results;
  results.reserve(changes.size());
  for (const Change& change : changes) results.push_back(apply_change(change));
  return results;
}

Result<void> MemoryStore::apply_change(const Change& change) {
  undo_.clear();
  for (const Mutation& mutation : change.mutations) {
    auto ok = std::visit([this](const auto& m) { return apply(m); }, mutation);
    if (ok) continue;
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
    undo_.clear();
    return ok;
  }
  undo_.clear();
  return {};
}

void MemoryStore::put_job(JobRecord job) {
  model::JobId id = job.id;
  std::optional<JobRecord> before;
  if (auto it = jobs_.find(id); it != jobs_.end()) before = std::move(it->second);
  jobs_.insert_or_assign(id, std::move(job));
  undo_.push_back([this, id, before = std::move(before)]() mutable {
    if (before) {
      jobs_.insert_or_assign(id, std::move(*before));
    } else {
      jobs_.erase(id);
    }
  });
}

Result<void> MemoryStore::apply(const InsertJob& m) {
  if (auto ok = check_job_record(m.job); !ok) return ok;
  if (jobs_.contains(m.job.id)) return std::unexpected(job_exists_error(m.job.id));
  put_job(m.job);
  return hold_resources(m.job);
}

Result<void> MemoryStore::apply(const UpdateJob& m) {
  if (m.job.id <= 0) return std::unexpected(job_not_found_error(m.job.id, "update"));
  if (auto ok = check_job_record(m.job); !ok) return ok;
  auto it = jobs_.find(m.job.id);
  if (it == jobs_.end()) return std::unexpected(job_not_found_error(m.job.id, "update"));
  JobRecord job = m.job;
  job.submission = it->second.submission;  // written once, at insert
  put_job(std::move(job));
  return hold_resources(m.job);
}

// Mirrors SqliteStore: drop what the job held, then take what its new record holds,
// GPUs in allocation order and then the port, stopping at the first one already held.
Result<void> MemoryStore::hold_resources(const JobRecord& job) {
  auto release = [&](auto& holds) {
    for (auto it = holds.begin(); it != holds.end();) {
      if (it->second != job.id) {
        ++it;
        continue;
      }
      undo_.push_back([&holds, key = it->first, id = job.id] { holds.emplace(key, id); });
      it = holds.erase(it);
    }
  };
  release(gpu_holds_);
  release(port_holds_);
  for (GpuKey& gpu : gpus_held_by(job)) {
    auto [it, inserted] = gpu_holds_.emplace(gpu, job.id);
    if (!inserted) return std::unexpected(gpu_held_error(gpu, it->second, job.id));
    undo_.push_back([this, key = std::move(gpu)] { gpu_holds_.erase(key); });
  }
  for (PortKey& port : ports_held_by(job)) {
    auto [it, inserted] = port_holds_.emplace(port, job.id);
    if (!inserted) return std::unexpected(port_held_error(port, it->second, job.id));
    undo_.push_back([this, key = std::move(port)] { port_holds_.erase(key); });
  }
  return {};
}

Result<void> MemoryStore::apply(const AppendEvent& m) {
  if (!jobs_.contains(m.event.job)) return std::unexpected(job_not_found_error(m.event.job, "append event"));
  auto& list = events_[m.event.job];
  list.push_back(m.event);
  // Leaving an empty list behind on undo is harmless: events() reads it as no events.
  undo_.push_back([&list] { list.pop_back(); });
  return {};
}

Result<void> MemoryStore::apply(const UpsertNode& m) {
  std::optional<model::Node> before;
  if (auto it = nodes_.find(m.node.name); it != nodes_.end()) before = it->second;
  nodes_.insert_or_assign(m.node.name, m.node);
  undo_.push_back([this, name = m.node.name, before = std::move(before)]() mutable {
    if (before) {
      nodes_.insert_or_assign(name, std::move(*before));
    } else {
      nodes_.erase(name);
    }
  });
  return {};
}

Result<void> MemoryStore::apply(const UpsertUser& m) {
  if (auto ok = check_user(m.user); !ok) return ok;
  for (const auto& [name, user] : users_) {
    if (user.token_hash == m.user.token_hash && name != m.user.name) {
      return std::unexpected(token_taken_error(name, m.user.name));
    }
  }
  std::optional<User> before;
  if (auto it = users_.find(m.user.name); it != users_.end()) before = it->second;
  users_.insert_or_assign(m.user.name, m.user);
  undo_.push_back([this, name = m.user.name, before = std::move(before)]() mutable {
    if (before) {
      users_.insert_or_assign(name, std::move(*before));
    } else {
      users_.erase(name);
    }
  });
  return {};
}

Result<void> MemoryStore::apply(const RecordSubmitKey& m) {
  if (auto ok = check_submit_key(m.key); !ok) return ok;
  if (!jobs_.contains(m.key.job)) return std::unexpected(job_not_found_error(m.key.job, "record submit key"));
  auto id = std::pair{m.key.user, m.key.key};
  if (!submit_keys_.emplace(id, m.key).second) return std::unexpected(submit_key_exists_error(m.key));
  undo_.push_back([this, id] { submit_keys_.erase(id); });
  return {};
}

Result<void> MemoryStore::apply(const PruneSubmitKeys& m) {
  std::vector<const SubmitKey*> old;
  for (const auto& [id, key] : submit_keys_) {
    if (key.at < m.before) old.push_back(&key);
  }
  std::sort(old.begin(), old.end(), [](const SubmitKey* a, const SubmitKey* b) { return a->at < b->at; });
  const auto limit = static_cast<std::size_t>(std::max(m.limit, 0));
  if (old.size() > limit) old.resize(limit);
  for (const SubmitKey* key : old) {
    SubmitKey gone = *key;
    submit_keys_.erase(std::pair{gone.user, gone.key});
    undo_.push_back([this, gone = std::move(gone)] { submit_keys_.emplace(std::pair{gone.user, gone.key}, gone); });
  }
  return {};
}

Result<Snapshot> MemoryStore::load() {
  Snapshot snap;
  for (const auto& [name, node] : nodes_) snap.nodes.push_back(node);
  for (const auto& [id, job] : jobs_) {
    if (!model::is_terminal(job.state) || job.fenced()) snap.active_jobs.push_back(job);
  }
  if (!jobs_.empty()) snap.max_job_id = jobs_.rbegin()->first;
  return snap;
}

Result<std::optional<JobRecord>> MemoryStore::job(model::JobId id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::optional<JobRecord>();
  return std::optional<JobRecord>(it->second);
}

Result<std::vector<JobRecord>> MemoryStore::jobs(const JobQuery& query) {
  std::vector<JobRecord> out;
  for (const auto& [id, job] : jobs_) {
    if (!query.include_terminal && model::is_terminal(job.state)) continue;
    if (query.user && job.user != *query.user) continue;
    out.push_back(job);
  }
  return out;
}

Result<std::optional<model::JobId>> MemoryStore::array_element(model::JobId array, int index) {
  for (const auto& [id, job] : jobs_) {
    if (job.array && job.array->job == array && job.array->index == index) return std::optional<model::JobId>(id);
  }
  return std::optional<model::JobId>();
}

Result<std::vector<JobRecord>> MemoryStore::ended_jobs(const EndedQuery& query) {
  std::vector<JobRecord> out;
  for (const auto& [id, job] : jobs_) {
    if (!model::is_terminal(job.state) || !job.ended_at || *job.ended_at < query.since) continue;
    if (query.until && *job.ended_at >= *query.until) continue;
    if (!query.users.empty() && std::find(query.users.begin(), query.users.end(), job.user) == query.users.end()) continue;
    if (!query.states.empty() && std::find(query.states.begin(), query.states.end(), job.state) == query.states.end()) continue;
    JobRecord light = job;
    light.spec_yaml.clear();
    light.ranks.clear();
    light.fences.clear();
    light.submission = {};
    out.push_back(std::move(light));
  }
  std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) {
    return std::tie(*a.ended_at, a.id) < std::tie(*b.ended_at, b.id);
  });
  if (query.limit != 0 && out.size() > query.limit) out.resize(query.limit);
  return out;
}

Result<std::vector<UsageRow>> MemoryStore::gpu_usage(const EndedQuery& query, UsageKey by) {
  if (!query.until) return make_error(ErrorCode::InvalidArgument, "gpu_usage needs an end of range");
  std::map<std::string, std::pair<std::int64_t, std::set<model::JobId>>> sums;
  for (const auto& [id, job] : jobs_) {
    if (!model::is_terminal(job.state) || !job.ended_at || !job.started_at || !job.allocation) continue;
    if (*job.ended_at < query.since || *job.ended_at >= *query.until) continue;
    if (!query.users.empty() && std::find(query.users.begin(), query.users.end(), job.user) == query.users.end()) continue;
    const std::int64_t ms = to_millis(std::min(*job.ended_at, *query.until)) - to_millis(std::max(*job.started_at, query.since));
    if (ms <= 0) continue;
    for (const auto& na : job.allocation->nodes) {
      for (int g : na.gpus) {
        std::string key = by == UsageKey::User ? job.user : by == UsageKey::Node ? na.node : "unknown";
        if (by == UsageKey::Class) {
          if (auto n = nodes_.find(na.node); n != nodes_.end()) {
            for (const auto& gpu : n->second.gpus) {
              if (gpu.index == g) key = gpu.cls.product;
            }
          }
        }
        auto& [total, jobs] = sums[key];
        total += ms;
        jobs.insert(id);
      }
    }
  }
  std::vector<UsageRow> out;
  for (const auto& [key, sum] : sums) out.push_back({key, sum.first, static_cast<std::int64_t>(sum.second.size())});
  return out;
}

Result<std::vector<JobEvent>> MemoryStore::events(model::JobId id) {
  auto it = events_.find(id);
  if (it == events_.end()) return std::vector<JobEvent>();
  return it->second;
}

Result<std::optional<User>> MemoryStore::user_by_token_hash(const std::string& token_hash) {
  for (const auto& [name, user] : users_) {
    if (user.token_hash == token_hash) return std::optional<User>(user);
  }
  return std::optional<User>();
}

Result<std::optional<SubmitKey>> MemoryStore::submit_key(const std::string& user, const std::string& key) {
  auto it = submit_keys_.find(std::pair{user, key});
  if (it == submit_keys_.end()) return std::optional<SubmitKey>();
  return std::optional<SubmitKey>(it->second);
}

Result<std::vector<User>> MemoryStore::users() {
  std::vector<User> out;
  for (const auto& [name, user] : users_) out.push_back(user);
  return out;
}

}  // namespace corral::store
