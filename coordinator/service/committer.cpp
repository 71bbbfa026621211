#include "coordinator/service/committer.hpp"

#include <chrono>

#include "coordinator/store/store_rules.hpp"

namespace corral::service {

void Committer::schedule_flush() {
  if (posted_) return;
  posted_ = true;
  // Posted work runs after every handler that is ready now: requests that arrived
  // together are committed together.
  loop_.post([this] {
    posted_ = false;
    flush();
  });
}

void Committer::enqueue(store::Change change, Done done) {
  // The same job changed again by the next report of the batch: one write of its latest
  // record (both callers hear how that went).
  if (!items_.empty() && items_.back().change && store::fold_job_update(*items_.back().change, change)) {
    ++folded_;
    if (done) {
      Done& first = items_.back().done;
      first = first ? Done([a = std::move(first), b = std::move(done)](const Result<void>& r) {
        a(r);
        b(r);
      })
                    : std::move(done);
    }
    return;
  }
  items_.push_back({std::move(change), std::move(done), {}});
  schedule_flush();
}

void Committer::then(std::function<void()> fn) {
  items_.push_back({std::nullopt, {}, std::move(fn)});
  schedule_flush();
}

void Committer::flush() {
  if (collect_) {
    for (auto& change : collect_()) enqueue(std::move(change));
  }
  if (items_.empty()) return;
  std::vector<Item> items;
  items.swap(items_);
  std::vector<store::Change> changes;
  for (auto& item : items) {
    if (item.change) changes.push_back(std::move(*item.change));
  }
  std::vector<Result<void>> results;
  if (!changes.empty()) {
    const auto started = std::chrono::steady_clock::now();
    results = store_.commit(changes);
    last_commit_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    commit_seconds_.observe(last_commit_seconds_);
    ++batches_;
    committed_ += changes.size();
  }
  // A refused change leaves memory ahead of the disk: nothing queued with it may be sent
  // or acknowledged (the owner stops, and its restart reloads the truth). The callers of
  // the changes that did commit still hear so.
  const Error* failure = nullptr;
  for (const auto& r : results) {
    if (!r && failure == nullptr) failure = &r.error();
  }
  std::size_t next = 0;
  for (auto& item : items) {
    if (item.then) {
      if (failure == nullptr) item.then();
      continue;
    }
    const Result<void>& r = results[next++];
    if (item.done) item.done(r);
  }
  if (failure != nullptr) return on_failure_(*failure);
  if (!changes.empty() && on_committed_) on_committed_();
}

}  // namespace corral::service
