#include "coordinator/service/committer.hpp"

#include <algorithm>
#include <chrono>

#include "coordinator/store/store_rules.hpp"

namespace corral::service {

Committer::Committer(net::EventLoop& loop, store::Store& store, std::function<void(const Error&)> on_failure,
                     std::function<void(const Error*)> on_store_state)
    : loop_(loop),
      store_(store),
      on_failure_(std::move(on_failure)),
      on_store_state_(std::move(on_store_state)),
      retry_timer_(std::make_unique<net::Timer>(loop)) {}

Committer::~Committer() = default;

void Committer::schedule_flush() {
  // While the store fails, the retry timer flushes: what is queued waits behind the
  // batch that could not be written.
  if (failing_) return;
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
  // The store wrote none of the batch (it fails a batch whole on such errors): keep it,
  // ahead of anything queued since, and try again. Nothing of it is answered or sent
  // until it commits, so memory ahead of the disk is never seen outside.
  if (failure != nullptr && store::cannot_write(*failure) &&
      std::all_of(results.begin(), results.end(), [](const Result<void>& r) { return !r; })) {
    ++retries_;
    --batches_;
    committed_ -= changes.size();
    const bool began = !failing_;
    failing_ = *failure;
    std::size_t k = 0;
    for (auto& item : items) {
      if (item.change) *item.change = std::move(changes[k++]);
    }
    for (auto& item : items_) items.push_back(std::move(item));
    items_ = std::move(items);
    retry_timer_->start(kRetry, [this] { flush(); });
    if (began && on_store_state_) on_store_state_(&*failing_);
    return;
  }
  if (failing_) {
    failing_.reset();
    retry_timer_->cancel();
    if (on_store_state_) on_store_state_(nullptr);
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
