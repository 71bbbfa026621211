// SubmitKeys on its own, over a MemoryStore: when it prunes, and what a prune leaves.

#include "coordinator/service/submit_keys.hpp"

#include <gtest/gtest.h>

#include "coordinator/store/memory_store.hpp"

namespace corral::service {
namespace {

using namespace std::chrono_literals;

TEST(SubmitKeys, PrunesAtOnceThenEveryTenMinutesAndKeepsAKeyForADay) {
  store::MemoryStore store;
  SubmitKeys keys(store);
  const TimePoint t0 = from_millis(1'800'000'000'000);
  store::Change made;
  store::JobRecord job;
  job.id = 1;
  job.user = "ada";
  made.mutations.emplace_back(store::InsertJob{job});
  keys.record("ada", "k", {1}, t0, made);
  EXPECT_EQ(keys.in_flight(), 1u);
  ASSERT_TRUE(store.commit(made).has_value());
  EXPECT_TRUE(keys.settle("ada", "k").empty());
  EXPECT_EQ(keys.in_flight(), 0u);

  SubmitKeys::Respond respond = [](net::HttpResponse) {};
  auto find = [&] { return keys.find("ada", "k", respond).value(); };
  EXPECT_EQ(find(), (std::vector<model::JobId>{1}));

  // The first prune comes at once; the next not before ten minutes.
  auto prune = keys.prune_due(t0 + 23h);
  ASSERT_TRUE(prune.has_value());
  ASSERT_TRUE(store.commit(*prune).has_value());
  EXPECT_EQ(find(), (std::vector<model::JobId>{1}));  // not a day old yet
  EXPECT_FALSE(keys.prune_due(t0 + 23h + 9min).has_value());
  prune = keys.prune_due(t0 + 24h + 1min);
  ASSERT_TRUE(prune.has_value());
  ASSERT_TRUE(store.commit(*prune).has_value());
  EXPECT_EQ(find(), std::nullopt);
}

TEST(SubmitKeys, ARetryOfAKeyBeingCommittedIsParkedUntilItSettles) {
  store::MemoryStore store;
  SubmitKeys keys(store);
  store::Change made;
  keys.record("ada", "k", {4, 5}, from_millis(1), made);
  int answered = 0;
  SubmitKeys::Respond respond = [&](net::HttpResponse) { ++answered; };
  auto found = keys.find("ada", "k", respond);
  ASSERT_TRUE(found.has_value());
  ASSERT_TRUE(found->has_value());
  EXPECT_TRUE((*found)->empty());  // parked
  // Bob's "k" is not Ada's.
  SubmitKeys::Respond bobs = [](net::HttpResponse) {};
  EXPECT_EQ(keys.find("bob", "k", bobs).value(), std::nullopt);
  auto waiting = keys.settle("ada", "k");
  ASSERT_EQ(waiting.size(), 1u);
  waiting.front()({});
  EXPECT_EQ(answered, 1);
}

}  // namespace
}  // namespace corral::service
