// The Committer: what it folds, and that every caller of a folded change hears its result.

#include "coordinator/service/committer.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/store/memory_store.hpp"

namespace corral::service {
namespace {

store::JobRecord job(model::JobId id, std::string reason) {
  store::JobRecord j;
  j.id = id;
  j.user = "ada";
  j.name = "job";
  j.reason = std::move(reason);
  return j;
}

store::Change update(const store::JobRecord& j, std::string event = {}) {
  store::Change c;
  c.mutations.emplace_back(store::UpdateJob{j});
  if (!event.empty()) c.mutations.emplace_back(store::AppendEvent{{j.id, {}, std::move(event)}});
  return c;
}

// The texts of job `id`'s events, in order.
std::vector<std::string> event_texts(store::Store& store, model::JobId id) {
  std::vector<std::string> texts;
  auto events = store.events(id);
  EXPECT_TRUE(events.has_value());
  if (events) {
    for (const auto& e : *events) texts.push_back(e.text);
  }
  return texts;
}

class CommitterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::Change c;
    c.mutations.emplace_back(store::InsertJob{job(1, "Resources")});
    c.mutations.emplace_back(store::InsertJob{job(2, "Resources")});
    ASSERT_TRUE(store_.commit(c).has_value());
  }
  // Records each callback's result, in the order they ran.
  Committer::Done record(std::string name) {
    return [this, name](const Result<void>& r) { heard_.push_back(name + (r ? " ok" : " failed")); };
  }

  net::EventLoop loop_;
  store::MemoryStore store_;
  std::vector<std::string> failures_;
  Committer committer_{loop_, store_, [this](const Error& e) { failures_.push_back(e.message()); }};
  std::vector<std::string> heard_;
};

TEST_F(CommitterTest, ReportsOfOneJobInABatchAreOneWriteOfItsLatestRecordAndEveryCallerHears) {
  committer_.enqueue(update(job(1, "a"), "first"), record("first"));
  committer_.enqueue(update(job(1, "b"), "second"), record("second"));
  committer_.enqueue(update(job(1, "c")), record("third"));
  committer_.flush();
  EXPECT_EQ(committer_.folded(), 2u);
  EXPECT_EQ(committer_.committed(), 1u);
  EXPECT_EQ(heard_, (std::vector<std::string>{"first ok", "second ok", "third ok"}));
  EXPECT_EQ((*store_.job(1))->reason, "c");
  EXPECT_EQ(event_texts(store_, 1), (std::vector<std::string>{"first", "second"}));
  EXPECT_TRUE(failures_.empty());
}

TEST_F(CommitterTest, AnotherJobOrAThenBetweenKeepsTheChangesApart) {
  committer_.enqueue(update(job(1, "a")), record("1a"));
  committer_.enqueue(update(job(2, "a")), record("2a"));
  committer_.enqueue(update(job(1, "b")), record("1b"));
  bool then_ran = false;
  committer_.then([&] { then_ran = true; });
  committer_.enqueue(update(job(1, "c")), record("1c"));
  committer_.flush();
  EXPECT_EQ(committer_.folded(), 0u);
  EXPECT_EQ(committer_.committed(), 4u);
  EXPECT_TRUE(then_ran);
  EXPECT_EQ((*store_.job(1))->reason, "c");
  EXPECT_EQ(heard_, (std::vector<std::string>{"1a ok", "2a ok", "1b ok", "1c ok"}));
}

TEST_F(CommitterTest, EveryCallerOfAFoldedChangeThatIsRefusedHearsSoAndNoThenRuns) {
  committer_.enqueue(update(job(7, "a")), record("first"));   // no job 7: NotFound
  committer_.enqueue(update(job(7, "b")), record("second"));
  bool then_ran = false;
  committer_.then([&] { then_ran = true; });
  committer_.flush();
  EXPECT_EQ(heard_, (std::vector<std::string>{"first failed", "second failed"}));
  EXPECT_FALSE(then_ran);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_NE(failures_[0].find("job 7"), std::string::npos) << failures_[0];
}

TEST_F(CommitterTest, WhatOnFlushGivesIsCommittedLastInTheBatchBeforeAnyThenRuns) {
  int collected = 0;
  committer_.on_flush([&] {
    ++collected;
    std::vector<store::Change> out;
    if (collected == 1) out.push_back(update(job(2, "from the ledger")));
    return out;
  });
  std::string seen_by_then;
  committer_.then([&] { seen_by_then = (*store_.job(2))->reason; });
  committer_.enqueue(update(job(2, "queued")), record("queued"));
  committer_.flush();
  EXPECT_EQ(seen_by_then, "from the ledger");
  EXPECT_EQ((*store_.job(2))->reason, "from the ledger");
  EXPECT_EQ(committer_.batches(), 1u);
  EXPECT_EQ(heard_, (std::vector<std::string>{"queued ok"}));
}

TEST_F(CommitterTest, AWakeWithNothingQueuedStillCommitsWhatOnFlushGives) {
  committer_.on_flush([&] {
    std::vector<store::Change> out;
    out.push_back(update(job(1, "woken")));
    return out;
  });
  committer_.wake();
  loop_.post([&] { loop_.stop(); });
  loop_.run();
  EXPECT_EQ((*store_.job(1))->reason, "woken");
}

// A store whose disk is full while `full` is set: it writes nothing of a batch, and says
// so for every change, as SqliteStore does on SQLITE_FULL.
class FullDiskStore final : public store::MemoryStore {
 public:
  bool full = false;
  int refused_batches = 0;
  std::vector<Result<void>> commit(std::span<const store::Change> changes) override {
    if (!full) return MemoryStore::commit(changes);
    ++refused_batches;
    return std::vector<Result<void>>(changes.size(),
                                     std::unexpected(Error(ErrorCode::ResourceExhausted, "database or disk is full")));
  }
  using MemoryStore::commit;
};

class CommitterOnAFullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::Change c;
    c.mutations.emplace_back(store::InsertJob{job(1, "Resources")});
    ASSERT_TRUE(store_.commit(c).has_value());
  }
  net::EventLoop loop_;
  FullDiskStore store_;
  std::vector<std::string> failures_;
  std::vector<std::string> states_;
  std::vector<std::string> heard_;
  Committer committer_{loop_, store_, [this](const Error& e) { failures_.push_back(e.message()); },
                       [this](const Error* e) { states_.push_back(e ? "failing: " + e->message() : "writing"); }};
};

TEST_F(CommitterOnAFullDiskTest, ABatchTheStoreCannotWriteIsKeptAndNothingOfItOrAfterItIsAnsweredUntilItCommits) {
  store_.full = true;
  committer_.enqueue(update(job(1, "a"), "first"), [this](const Result<void>& r) { heard_.push_back(r ? "a ok" : "a failed"); });
  committer_.then([this] { heard_.push_back("then"); });
  committer_.flush();
  EXPECT_TRUE(heard_.empty());
  ASSERT_TRUE(committer_.failing().has_value());
  EXPECT_EQ(committer_.failing()->code(), ErrorCode::ResourceExhausted);
  EXPECT_EQ(states_, (std::vector<std::string>{"failing: database or disk is full"}));
  EXPECT_TRUE(failures_.empty()) << "a full disk is not a refused change: the coordinator must not stop";
  // Queued while the store fails: it waits behind the kept batch, in order.
  committer_.enqueue(update(job(1, "b"), "second"), [this](const Result<void>& r) { heard_.push_back(r ? "b ok" : "b failed"); });
  committer_.flush();  // still full: tried again, still kept
  EXPECT_TRUE(heard_.empty());
  EXPECT_EQ(committer_.retries(), 2u);
  EXPECT_EQ(states_.size(), 1u) << "one report of the failure, not one per try";
  EXPECT_EQ((*store_.job(1))->reason, "Resources");

  store_.full = false;
  // The retry timer writes it: the loop runs until it has.
  auto until_written = std::make_unique<net::Timer>(loop_);
  until_written->start_repeating(std::chrono::milliseconds(10), [&] {
    if (!committer_.failing()) loop_.stop();
  });
  auto give_up = std::make_unique<net::Timer>(loop_);
  give_up->start(std::chrono::seconds(10), [&] { loop_.stop(); });
  loop_.run();
  EXPECT_FALSE(committer_.failing().has_value());
  EXPECT_EQ(heard_, (std::vector<std::string>{"a ok", "then", "b ok"}));
  EXPECT_EQ(states_, (std::vector<std::string>{"failing: database or disk is full", "writing"}));
  EXPECT_EQ((*store_.job(1))->reason, "b");
  EXPECT_EQ(event_texts(store_, 1), (std::vector<std::string>{"first", "second"}));
  EXPECT_TRUE(failures_.empty());
}

TEST_F(CommitterOnAFullDiskTest, AChangeRefusedForItsContentStillStopsTheOwner) {
  store::Change c;
  c.mutations.emplace_back(store::InsertJob{job(1, "again")});  // job 1 exists: Conflict
  committer_.enqueue(std::move(c));
  committer_.flush();
  EXPECT_FALSE(committer_.failing().has_value());
  EXPECT_EQ(failures_.size(), 1u);
  EXPECT_TRUE(states_.empty());
}

}  // namespace
}  // namespace corral::service
