#include "coordinator/service/submit_keys.hpp"

#include <algorithm>

namespace corral::service {

Result<std::string> SubmitKeys::key_of(const net::HttpRequest& request) {
  const std::size_t count = request.header_count("idempotency-key");
  if (count == 0) return std::string();
  if (count > 1) return make_error(ErrorCode::InvalidArgument, "Idempotency-Key: given more than once");
  std::string key = request.header("idempotency-key");
  if (key.empty() || key.size() > kMaxKeyLength) {
    return make_error(ErrorCode::InvalidArgument, "Idempotency-Key: must be 1 to " +
                                                      std::to_string(kMaxKeyLength) + " characters, got " +
                                                      std::to_string(key.size()));
  }
  // Visible ASCII only: the key is stored and logged, and a retry must send the same
  // bytes to match.
  auto bad = std::find_if(key.begin(), key.end(), [](char c) { return c <= ' ' || c >= 0x7f; });
  if (bad != key.end()) {
    return make_error(ErrorCode::InvalidArgument,
                      "Idempotency-Key: must be visible ASCII characters (no spaces); character " +
                          std::to_string(bad - key.begin() + 1) + " is not");
  }
  return key;
}

Result<std::optional<std::vector<model::JobId>>> SubmitKeys::find(const std::string& user,
                                                                  const std::string& key, Respond& respond) {
  using Found = std::optional<std::vector<model::JobId>>;
  if (auto it = in_flight_.find({user, key}); it != in_flight_.end()) {
    it->second.push_back(std::move(respond));
    return Found(std::vector<model::JobId>{});
  }
  auto stored = store_.submit_key(user, key);
  if (!stored) return std::unexpected(stored.error());
  if (!*stored) return Found();
  std::vector<model::JobId> ids;
  ids.reserve(static_cast<std::size_t>((*stored)->jobs));
  for (int i = 0; i < (*stored)->jobs; ++i) ids.push_back((*stored)->job + i);
  return Found(std::move(ids));
}

void SubmitKeys::record(const std::string& user, const std::string& key, const std::vector<model::JobId>& ids,
                        TimePoint now, store::Change& change) {
  change.mutations.emplace_back(
      store::RecordSubmitKey{{user, key, ids.front(), static_cast<int>(ids.size()), now}});
  in_flight_.try_emplace({user, key});
}

std::vector<SubmitKeys::Respond> SubmitKeys::settle(const std::string& user, const std::string& key) {
  auto node = in_flight_.extract({user, key});
  return node ? std::move(node.mapped()) : std::vector<Respond>{};
}

std::optional<store::Change> SubmitKeys::prune_due(TimePoint now) {
  if (last_prune_ && now - *last_prune_ < kPruneEvery) return std::nullopt;
  last_prune_ = now;
  store::Change change;
  change.mutations.emplace_back(store::PruneSubmitKeys{now - kKeep, kPruneBatch});
  return change;
}

}  // namespace corral::service
