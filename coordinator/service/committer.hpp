#pragma once
// Committer: group commit for the coordinator. State changes queue here during one turn
// of the event loop and are written in one SQLite transaction (one sync) at the end of
// it; only then do their callbacks run, which is where responses and agent messages
// are sent. So nothing is acknowledged or acted on before it is durable. A batch the
// store could not write at all (disk full, read-only, I/O error: `store::cannot_write`) is kept,
// whole and in order, and tried again every `kRetry` until it commits; meanwhile nothing
// queued after it runs either, and failing() says why. Lives on the event loop's thread.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/core/histogram.hpp"
#include "common/net/event_loop.hpp"
#include "coordinator/store/store.hpp"

namespace corral::service {

class Committer {
 public:
  using Done = std::function<void(const Result<void>&)>;
  static constexpr std::chrono::milliseconds kRetry{250};

  // `on_failure`: a change was refused for its content, so memory is ahead of the disk
  // for good (a fault in the caller). `on_store_state`: the store began failing (the
  // error) or recovered (nullptr).
  Committer(net::EventLoop& loop, store::Store& store, std::function<void(const Error&)> on_failure,
            std::function<void(const Error*)> on_store_state = {});
  ~Committer();

  // Queues a change; `done` runs once it is committed (or failed). A change that only
  // updates the job the last queued change only updated is folded into it
  // (store::fold_job_update).
  void enqueue(store::Change change, Done done = {});
  // Runs `fn` once everything queued before it is durable; never, if a change of its
  // batch was refused.
  void then(std::function<void()> fn);
  // Commits what is queued now, on this call's stack (for shutdown and tests).
  void flush();
  // Called as each batch is about to commit: the changes it returns are committed last in
  // the batch (the ledger's rank records, one write per job per batch).
  void on_flush(std::function<std::vector<store::Change>()> collect) { collect_ = std::move(collect); }
  // A flush is due although nothing was queued: on_flush has something to give.
  void wake() { schedule_flush(); }
  // Called after each batch that committed changes (the status page's change counter).
  void on_committed(std::function<void()> fn) { on_committed_ = std::move(fn); }

  std::size_t batches() const { return batches_; }
  std::size_t committed() const { return committed_; }
  std::size_t folded() const { return folded_; }
  // How long each batch's commit took (one SQLite transaction and its sync).
  const Histogram& commit_seconds() const { return commit_seconds_; }
  double last_commit_seconds() const { return last_commit_seconds_; }
  // Why the store cannot write now; nullopt while it can.
  const std::optional<Error>& failing() const { return failing_; }
  // Batches that failed as a whole and were kept to be tried again.
  std::size_t retries() const { return retries_; }

 private:
  struct Item {
    std::optional<store::Change> change;
    Done done;
    std::function<void()> then;
  };
  void schedule_flush();

  net::EventLoop& loop_;
  store::Store& store_;
  std::function<void(const Error&)> on_failure_;
  std::function<void(const Error*)> on_store_state_;
  std::unique_ptr<net::Timer> retry_timer_;
  std::optional<Error> failing_;
  std::size_t retries_ = 0;
  std::function<void()> on_committed_;
  std::function<std::vector<store::Change>()> collect_;
  std::vector<Item> items_;
  bool posted_ = false;
  std::size_t batches_ = 0;
  std::size_t committed_ = 0;
  std::size_t folded_ = 0;
  double last_commit_seconds_ = 0;
  Histogram commit_seconds_{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
};

}  // namespace corral::service
