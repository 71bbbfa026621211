// The Store contract: every implementation runs this one suite.

#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/store/memory_store.hpp"
#include "coordinator/store/sqlite_store.hpp"
#include "coordinator/store/store_rules.hpp"
#include "tests/unit/store/temp_dir.hpp"

namespace corral::store {
namespace {

using model::JobState;
using ::testing::HasSubstr;
using ::testing::Not;

struct MemoryImpl {
  static constexpr const char* kName = "Memory";
  Result<std::unique_ptr<Store>> make() { return std::make_unique<MemoryStore>(); }
};

struct SqliteImpl {
  static constexpr const char* kName = "Sqlite";
  testing::TempDir dir;
  Result<std::unique_ptr<Store>> make() {
    auto store = SqliteStore::open(dir.file("corral.db"));
    if (!store) return std::unexpected(store.error());
    return std::unique_ptr<Store>(std::move(*store));
  }
};

struct ImplName {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

// ---- builders ----

TimePoint at(std::int64_t ms) {
  return from_millis(ms);
}

model::Allocation alloc(const std::string& node, std::vector<int> gpus, const std::string& addr, int port) {
  return model::Allocation{{{node, std::move(gpus)}}, addr, port};
}

JobRecord pending(model::JobId id, const std::string& user = "ada") {
  JobRecord job;
  job.id = id;
  job.user = user;
  job.name = "job-" + std::to_string(id);
  job.spec_yaml = "name: job-" + std::to_string(id) + "\n";
  job.submitted_at = at(1'700'000'000'000 + id);
  job.reason = "Resources";
  return job;
}

JobRecord running(model::JobId id, model::Allocation allocation) {
  JobRecord job = pending(id);
  job.state = JobState::Running;
  job.reason.clear();
  job.started_at = at(1'700'000'100'000 + id);
  job.allocation = std::move(allocation);
  return job;
}

JobRecord ended(JobRecord job, JobState state) {
  job.state = state;
  job.ended_at = at(1'700'000'200'000 + job.id);
  return job;
}

// Every field set, with text that would trip a careless encoder.
JobRecord every_field(model::JobId id) {
  JobRecord job;
  job.id = id;
  job.user = "grace";
  job.name = "llama \"7b\" fine-tune — ünïcode";
  job.spec_yaml = "name: x\nresources:\n  gpus: 8\ncommand: ['python', \"train.py\"]\n";
  job.state = JobState::Failed;
  job.reason = "rank 3 exited with 137";
  job.detail = "rank 3 on gpu-b killed by signal 9 (Killed)";
  job.attempt = 2;
  job.submitted_at = at(1'712'345'678'901);
  job.started_at = at(1'712'345'679'000);
  job.ended_at = at(1'712'349'999'999);
  job.allocation = model::Allocation{{{"gpu-a", {3, 1, 2, 0}}, {"gpu-b", {7}}}, "10.0.0.17", 29517};
  job.nccl_id = std::string(256, 'a');
  job.failed_rank = 3;
  job.failed_node = "gpu-b";
  job.exit_code = 137;
  job.ranks = {
      {0, "gpu-a", 0, {3, 1}, {"GPU-a3", "GPU-a1"}, 4242, model::RankState::Exited, 0, std::nullopt},
      {1, "gpu-a", 1, {2, 0}, {"GPU-a2", "GPU-a0"}, 4243, model::RankState::Killed, std::nullopt, 15},
      {2, "gpu-b", 0, {7}, {"GPU-b7"}, 0, model::RankState::Pending, std::nullopt, std::nullopt},
      {3, "gpu-b", 1, {}, {}, 977, model::RankState::Exited, 137, 9},
  };
  job.submission = {"/home/grace/run", {{"HF_HOME", "/data/hf"}, {"PATH", "/venv/bin:/usr/bin"}, {"Q", "a\"b\n"}}};
  job.array = ArrayElement{40, 2};
  return job;
}

model::Node node(const std::string& name, int gpus) {
  model::Node n;
  n.name = name;
  n.address = "10.0.0." + std::to_string(name.size());
  n.state = model::NodeState::Up;
  n.ports = {29500, 29599};
  for (int i = 0; i < gpus; ++i) {
    model::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + name + "-" + std::to_string(i);
    g.pci_bus_id = "00000000:0" + std::to_string(i) + ":00.0";
    g.cls = {"NVIDIA H100 80GB HBM3", 81559, "550.54.15"};
    g.cuda = {12, 4};
    if (i % 2 == 0 && i + 1 < gpus) g.nvlink_peers = {i + 1};
    n.gpus.push_back(std::move(g));
  }
  return n;
}

template <typename... M>
Change change(M&&... mutations) {
  Change c;
  (c.mutations.emplace_back(std::forward<M>(mutations)), ...);
  return c;
}

JobEvent event(model::JobId job, std::int64_t ms, std::string text) {
  return {job, at(ms), std::move(text)};
}

// A well-formed token hash: 64 lowercase hex characters, all `c`.
std::string hash_of(char c) {
  return std::string(64, c);
}

User user(const std::string& name, char hash, bool admin = false) {
  return {name, hash_of(hash), admin};
}

// ---- fixture ----

template <typename Impl>
class StoreContract : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = impl_.make();
    ASSERT_TRUE(made.has_value()) << made.error().to_string();
    store_ = std::move(*made);
  }

  void commit_ok(const Change& c) {
    auto r = store_->commit(c);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
  }
  void insert(const JobRecord& job) { commit_ok(change(InsertJob{job})); }
  void upsert(const User& u) { commit_ok(change(UpsertUser{u})); }
  void update(const JobRecord& job) { commit_ok(change(UpdateJob{job})); }

  std::optional<JobRecord> read(model::JobId id) {
    auto r = store_->job(id);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : std::nullopt;
  }
  std::vector<JobEvent> events_of(model::JobId id) {
    auto r = store_->events(id);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : std::vector<JobEvent>{};
  }
  std::vector<model::JobId> ids(const JobQuery& q) {
    auto r = store_->jobs(q);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    std::vector<model::JobId> out;
    if (r) {
      for (const auto& j : *r) out.push_back(j.id);
    }
    return out;
  }
  std::optional<User> by_hash(const std::string& hash) {
    auto r = store_->user_by_token_hash(hash);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : std::nullopt;
  }
  std::vector<User> all_users() {
    auto r = store_->users();
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : std::vector<User>{};
  }
  Snapshot snapshot() {
    auto r = store_->load();
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r ? *r : Snapshot{};
  }

  Impl impl_;
  std::unique_ptr<Store> store_;
};

using Implementations = ::testing::Types<MemoryImpl, SqliteImpl>;
TYPED_TEST_SUITE(StoreContract, Implementations, ImplName);

// ---- jobs and events ----

TYPED_TEST(StoreContract, InsertedJobReadsBackWithEveryField) {
  JobRecord job = every_field(42);
  this->insert(job);
  EXPECT_EQ(this->read(42), job);
}

TYPED_TEST(StoreContract, JobWithoutOptionalFieldsReadsBackWithoutThem) {
  JobRecord job = pending(7);
  job.reason.clear();
  job.spec_yaml.clear();
  job.submitted_at = at(0);
  this->insert(job);
  auto back = this->read(7);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, job);
  EXPECT_FALSE(back->started_at.has_value());
  EXPECT_FALSE(back->ended_at.has_value());
  EXPECT_FALSE(back->allocation.has_value());
  EXPECT_FALSE(back->failed_rank.has_value());
  EXPECT_FALSE(back->exit_code.has_value());
  EXPECT_TRUE(back->ranks.empty());
}

TYPED_TEST(StoreContract, TimestampsKeepMillisecondsIncludingBeforeTheEpoch) {
  JobRecord job = pending(3);
  job.submitted_at = at(-1);
  job.started_at = at(1);
  job.ended_at = at(253'402'300'799'999);  // 9999-12-31T23:59:59.999Z
  this->insert(job);
  EXPECT_EQ(this->read(3), job);
}

TYPED_TEST(StoreContract, UpdateReplacesEveryFieldButWhereAndWithWhatItWasSubmitted) {
  JobRecord submitted = pending(5);
  submitted.submission = {"/srv/a", {{"A", "1"}}};
  this->insert(submitted);
  JobRecord changed = every_field(5);
  changed.state = JobState::Running;
  this->update(changed);
  changed.submission = submitted.submission;  // written once, at insert
  EXPECT_EQ(this->read(5), changed);
  JobRecord requeued = pending(5);
  requeued.attempt = 3;
  this->update(requeued);
  requeued.submission = submitted.submission;
  EXPECT_EQ(this->read(5), requeued);
}

TYPED_TEST(StoreContract, EndedJobsComeByEndTimeWithinTheRangeAndLight) {
  JobRecord full = every_field(50);  // FAILED, ended at 1'712'349'999'999
  this->insert(full);
  this->insert(ended(pending(9), JobState::Cancelled));   // ended at 1'700'000'200'009
  this->insert(ended(pending(8), JobState::Completed));   // ended at 1'700'000'200'008
  this->insert(pending(10));                               // live: never listed
  JobRecord requeued = pending(11);
  requeued.ended_at = at(1'700'000'200'100);               // a stale end on a live job: not listed
  this->insert(requeued);
  auto all = this->store_->ended_jobs(EndedQuery{at(0), std::nullopt, 0});
  ASSERT_TRUE(all.has_value()) << all.error().message();
  std::vector<model::JobId> ids;
  for (const auto& j : *all) ids.push_back(j.id);
  EXPECT_EQ(ids, (std::vector<model::JobId>{8, 9, 50}));
  // Without what a history does not show, and with the rest.
  const JobRecord& back = all->back();
  EXPECT_TRUE(back.spec_yaml.empty());
  EXPECT_TRUE(back.ranks.empty());
  EXPECT_EQ(back.allocation, full.allocation);
  EXPECT_EQ(back.exit_code, 137);
  EXPECT_EQ(back.failed_node, "gpu-b");
  EXPECT_EQ(back.detail, full.detail);
  auto range = this->store_->ended_jobs(EndedQuery{at(1'700'000'200'009), at(1'712'349'999'999), 0});
  ASSERT_TRUE(range.has_value());
  ASSERT_EQ(range->size(), 1u);
  EXPECT_EQ(range->front().id, 9);
  auto first = this->store_->ended_jobs(EndedQuery{at(0), std::nullopt, 2});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->size(), 2u);
  auto filtered = this->store_->ended_jobs(
      EndedQuery{at(0), std::nullopt, 0, {"ada", "grace"}, {JobState::Failed, JobState::Completed}});
  ASSERT_TRUE(filtered.has_value());
  ids.clear();
  for (const auto& j : *filtered) ids.push_back(j.id);
  EXPECT_EQ(ids, (std::vector<model::JobId>{8, 50}));  // 9 was CANCELLED
}

TYPED_TEST(StoreContract, GpuUsageSumsEachGpusTimeWithinTheRangeByUserNodeAndClass) {
  model::Node a = node("gpu-a", 4);  // every GPU of node() is one product
  ASSERT_TRUE(this->store_->commit(Change{{UpsertNode{a}}}).has_value());
  const std::string product = a.gpus.front().cls.product;
  auto job = [](model::JobId id, const std::string& user, model::Allocation alloc, std::int64_t start, std::int64_t end) {
    JobRecord j = running(id, std::move(alloc));
    j.user = user;
    j.state = JobState::Completed;
    j.started_at = at(start);
    j.ended_at = at(end);
    return j;
  };
  // 2 GPUs for 10 s; 1 GPU on gpu-a and 1 on a node no longer known for 4 s, half of it
  // before the range; one that ended after it.
  this->insert(job(1, "ada", alloc("gpu-a", {0, 1}, "10.0.0.1", 29500), 10'000, 20'000));
  this->insert(job(2, "bob", model::Allocation{{{"gpu-a", {2}}, {"gone", {0}}}, "10.0.0.1", 29501}, 8'000, 12'000));
  this->insert(job(3, "bob", alloc("gpu-a", {3}, "10.0.0.1", 29502), 10'000, 90'000));
  this->insert(pending(4));
  const EndedQuery range{at(10'000), at(60'000), 0};
  auto by_user = this->store_->gpu_usage(range, UsageKey::User);
  ASSERT_TRUE(by_user.has_value()) << by_user.error().message();
  EXPECT_EQ(*by_user, (std::vector<UsageRow>{{"ada", 20'000, 1}, {"bob", 4'000, 1}}));
  auto by_node = this->store_->gpu_usage(range, UsageKey::Node);
  ASSERT_TRUE(by_node.has_value());
  EXPECT_EQ(*by_node, (std::vector<UsageRow>{{"gone", 2'000, 1}, {"gpu-a", 22'000, 2}}));
  auto by_class = this->store_->gpu_usage(range, UsageKey::Class);
  ASSERT_TRUE(by_class.has_value());
  EXPECT_EQ(*by_class, (std::vector<UsageRow>{{product, 22'000, 2}, {"unknown", 2'000, 1}}));
  // One user's own GPU time (a private usage): by node, only where bob's jobs ran.
  EndedQuery bobs = range;
  bobs.users = {"bob"};
  auto bob_by_node = this->store_->gpu_usage(bobs, UsageKey::Node);
  ASSERT_TRUE(bob_by_node.has_value()) << bob_by_node.error().message();
  EXPECT_EQ(*bob_by_node, (std::vector<UsageRow>{{"gone", 2'000, 1}, {"gpu-a", 2'000, 1}}));
  bobs.users = {"bob", "ada"};
  EXPECT_EQ(this->store_->gpu_usage(bobs, UsageKey::User).value(), *by_user);
}

TYPED_TEST(StoreContract, AnArrayElementIsFoundByItsArrayAndIndex) {
  this->insert(every_field(42));  // array 40, index 2
  JobRecord other = pending(43);
  other.array = ArrayElement{40, 3};
  this->insert(other);
  EXPECT_EQ(this->store_->array_element(40, 2).value(), std::optional<model::JobId>(42));
  EXPECT_EQ(this->store_->array_element(40, 3).value(), std::optional<model::JobId>(43));
  EXPECT_FALSE(this->store_->array_element(40, 4).value().has_value());
  EXPECT_FALSE(this->store_->array_element(41, 2).value().has_value());
}

TYPED_TEST(StoreContract, UnknownJobReadsAsNothing) {
  EXPECT_EQ(this->read(99), std::nullopt);
  EXPECT_TRUE(this->events_of(99).empty());
}

TYPED_TEST(StoreContract, DuplicateInsertIsConflictAndKeepsTheFirst) {
  this->insert(pending(1, "ada"));
  auto r = this->store_->commit(change(InsertJob{pending(1, "bob")}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  EXPECT_THAT(r.error().message(), HasSubstr("job 1 already exists"));
  EXPECT_EQ(this->read(1)->user, "ada");
}

TYPED_TEST(StoreContract, InsertWithNonPositiveIdIsInvalidArgument) {
  auto r = this->store_->commit(change(InsertJob{pending(0)}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
}

TYPED_TEST(StoreContract, UpdatingAnUnknownJobIsNotFound) {
  auto r = this->store_->commit(change(UpdateJob{pending(12)}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::NotFound);
  EXPECT_THAT(r.error().message(), HasSubstr("job 12 does not exist"));
  EXPECT_EQ(this->read(12), std::nullopt);
}

TYPED_TEST(StoreContract, EventsReadBackInAppendOrder) {
  this->insert(pending(1));
  this->insert(pending(2));
  this->commit_ok(change(AppendEvent{event(1, 30, "submitted")}, AppendEvent{event(2, 10, "submitted")}));
  // Out of timestamp order on purpose: the order is that of appending.
  this->commit_ok(change(AppendEvent{event(1, 20, "PENDING -> STARTING on gpu-a")}));
  this->commit_ok(change(AppendEvent{event(1, 40, "STARTING -> RUNNING")}));
  EXPECT_EQ(this->events_of(1),
            (std::vector<JobEvent>{event(1, 30, "submitted"), event(1, 20, "PENDING -> STARTING on gpu-a"),
                                   event(1, 40, "STARTING -> RUNNING")}));
  EXPECT_EQ(this->events_of(2), (std::vector<JobEvent>{event(2, 10, "submitted")}));
}

TYPED_TEST(StoreContract, EventForAnUnknownJobIsNotFound) {
  auto r = this->store_->commit(change(AppendEvent{event(8, 1, "x")}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::NotFound);
  EXPECT_TRUE(this->events_of(8).empty());
}

TYPED_TEST(StoreContract, JobsQueryIsOrderedByIdAndFiltersTerminalAndUser) {
  this->insert(pending(4, "ada"));
  this->insert(ended(pending(2, "bob"), JobState::Completed));
  this->insert(pending(3, "bob"));
  JobRecord starting = running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500));
  starting.state = JobState::Starting;
  starting.user = "ada";
  this->insert(starting);
  this->insert(ended(pending(5, "ada"), JobState::NodeFail));

  EXPECT_EQ(this->ids({}), (std::vector<model::JobId>{1, 2, 3, 4, 5}));
  EXPECT_EQ(this->ids({.include_terminal = false, .user = std::nullopt}),
            (std::vector<model::JobId>{1, 3, 4}));
  EXPECT_EQ(this->ids({.user = "ada"}), (std::vector<model::JobId>{1, 4, 5}));
  EXPECT_EQ(this->ids({.include_terminal = false, .user = "bob"}), (std::vector<model::JobId>{3}));
  EXPECT_TRUE(this->ids({.user = "nobody"}).empty());
}

TYPED_TEST(StoreContract, JobsQueryReturnsWholeRecords) {
  this->insert(every_field(9));
  auto r = this->store_->jobs({});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, std::vector<JobRecord>{every_field(9)});
}

// ---- ranks ----

TYPED_TEST(StoreContract, RanksKeepTheirOrderAndTellAbsentExitCodesFromZero) {
  JobRecord job = pending(4);
  job.ranks = {{1, "gpu-b", 0, {5}, {"GPU-5"}, 100, model::RankState::Exited, 0, std::nullopt},
               {0, "gpu-a", 0, {0}, {"GPU-0"}, 101, model::RankState::Running, std::nullopt, std::nullopt},
               {2, "gpu-a", 1, {1}, {"GPU-1"}, 102, model::RankState::Killed, -1, 0}};
  this->insert(job);
  auto back = this->read(4);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->ranks, job.ranks);
  EXPECT_EQ(back->ranks[0].exit_code, 0);
  EXPECT_FALSE(back->ranks[0].signal.has_value());
  EXPECT_FALSE(back->ranks[1].exit_code.has_value());
  EXPECT_EQ(back->ranks[2].signal, 0);
}

TYPED_TEST(StoreContract, UpdateReplacesTheRankList) {
  JobRecord job = running(1, alloc("gpu-a", {0, 1}, "10.0.0.1", 29500));
  this->insert(job);
  EXPECT_TRUE(this->read(1)->ranks.empty());
  job.ranks = {{0, "gpu-a", 0, {0}, {"GPU-0"}, 0, model::RankState::Pending, std::nullopt, std::nullopt},
               {1, "gpu-a", 1, {1}, {"GPU-1"}, 0, model::RankState::Pending, std::nullopt, std::nullopt}};
  this->update(job);
  EXPECT_EQ(this->read(1), job);
  job.ranks[1].pid = 31337;
  job.ranks[1].state = model::RankState::Running;
  this->update(job);
  EXPECT_EQ(this->read(1), job);
  // A requeue starts the next attempt with no ranks.
  job.state = JobState::Pending;
  job.attempt = 1;
  job.ranks.clear();
  this->update(job);
  EXPECT_EQ(this->read(1), job);
}

TYPED_TEST(StoreContract, LoadAndJobsQueryCarryRanks) {
  JobRecord job = running(2, alloc("gpu-a", {0}, "10.0.0.1", 29500));
  job.ranks = {{0, "gpu-a", 0, {0}, {"GPU-0"}, 77, model::RankState::Running, std::nullopt, std::nullopt}};
  this->insert(job);
  EXPECT_EQ(this->snapshot().active_jobs, std::vector<JobRecord>{job});
  auto listed = this->store_->jobs({.include_terminal = false, .user = "ada"});
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(*listed, std::vector<JobRecord>{job});
}

// ---- users ----

TYPED_TEST(StoreContract, NoUsersAtFirst) {
  EXPECT_TRUE(this->all_users().empty());
  EXPECT_EQ(this->by_hash(hash_of('a')), std::nullopt);
}

TYPED_TEST(StoreContract, UserIsFoundByTokenHash) {
  this->upsert(user("alice", 'a'));
  this->upsert(user("root", 'b', /*admin=*/true));
  EXPECT_EQ(this->by_hash(hash_of('a')), user("alice", 'a'));
  EXPECT_EQ(this->by_hash(hash_of('b')), user("root", 'b', true));
  EXPECT_EQ(this->by_hash(hash_of('c')), std::nullopt);
  // Not a hash at all: simply nobody.
  EXPECT_EQ(this->by_hash(""), std::nullopt);
}

TYPED_TEST(StoreContract, UsersAreListedByName) {
  this->upsert(user("zed", '1'));
  this->upsert(user("alice", '2'));
  this->upsert(user("Bob", '3'));
  this->upsert(user("alice.b", '4'));
  // Byte order, as SQLite's BINARY collation: upper case before lower case.
  EXPECT_EQ(this->all_users(), (std::vector<User>{user("Bob", '3'), user("alice", '2'), user("alice.b", '4'),
                                                  user("zed", '1')}));
}

TYPED_TEST(StoreContract, UpsertUserReplacesTokenAndAdminByName) {
  this->upsert(user("alice", 'a'));
  this->upsert(user("alice", 'c', /*admin=*/true));
  EXPECT_EQ(this->by_hash(hash_of('a')), std::nullopt);  // the old token no longer works
  EXPECT_EQ(this->by_hash(hash_of('c')), user("alice", 'c', true));
  // The same record again is no conflict with itself.
  this->upsert(user("alice", 'c', true));
  EXPECT_EQ(this->all_users(), std::vector<User>{user("alice", 'c', true)});
}

TYPED_TEST(StoreContract, AnotherUsersTokenIsConflictNamingTheHolderNotTheHash) {
  this->upsert(user("alice", 'a'));
  this->upsert(user("bob", 'b'));
  for (const User& taker : {user("carol", 'a'), user("bob", 'a', true)}) {
    SCOPED_TRACE(taker.name);
    auto r = this->store_->commit(change(UpsertUser{taker}));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
    EXPECT_THAT(r.error().message(), HasSubstr("already belongs to user alice"));
    EXPECT_THAT(r.error().message(), Not(HasSubstr(hash_of('a'))));
  }
  EXPECT_EQ(this->all_users(), (std::vector<User>{user("alice", 'a'), user("bob", 'b')}));
}

TYPED_TEST(StoreContract, ATokenGivenUpInTheSameChangeCanBeTaken) {
  this->upsert(user("alice", 'a'));
  // Order matters: alice lets go of the token before bob takes it.
  this->commit_ok(change(UpsertUser{user("alice", 'c')}, UpsertUser{user("bob", 'a')}));
  EXPECT_EQ(this->by_hash(hash_of('a')), user("bob", 'a'));
  auto r = this->store_->commit(change(UpsertUser{user("carol", 'd')}, UpsertUser{user("dave", 'd')}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  EXPECT_EQ(this->by_hash(hash_of('d')), std::nullopt);  // carol went with the change
}

TYPED_TEST(StoreContract, BadUserNamesAreInvalidArgument) {
  for (const std::string& name :
       {std::string(), std::string(65, 'a'), std::string("al ice"), std::string("a/b"), std::string("root;"),
        std::string("l\u00e9a"), std::string("\xc3\xa9"), std::string("a\n"), std::string("a\0b", 3)}) {
    SCOPED_TRACE(::testing::PrintToString(name));
    auto r = this->store_->commit(change(UpsertUser{{name, hash_of('a'), false}}));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
    EXPECT_THAT(r.error().message(), HasSubstr("user name must be 1 to 64 characters of [A-Za-z0-9._-]"));
  }
  EXPECT_TRUE(this->all_users().empty());
  // The edges that are fine.
  this->upsert({std::string(64, 'z'), hash_of('1'), false});
  this->upsert({"a", hash_of('2'), false});
  this->upsert({"ML-team_2.svc", hash_of('3'), false});
  EXPECT_EQ(this->all_users().size(), 3u);
}

TYPED_TEST(StoreContract, BadTokenHashesAreInvalidArgument) {
  for (const std::string& hash :
       {std::string(), std::string(63, 'a'), std::string(65, 'a'), std::string(64, 'A'),
        std::string(63, 'a') + "g", std::string(63, 'a') + " "}) {
    SCOPED_TRACE(hash);
    auto r = this->store_->commit(change(UpsertUser{{"alice", hash, false}}));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
    EXPECT_THAT(r.error().message(), HasSubstr("token hash must be 64 lowercase hex characters"));
  }
  EXPECT_TRUE(this->all_users().empty());
  this->upsert({"alice", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", false});
}

// ---- nodes and load ----

TYPED_TEST(StoreContract, EmptyStoreLoadsEmpty) {
  Snapshot snap = this->snapshot();
  EXPECT_TRUE(snap.nodes.empty());
  EXPECT_TRUE(snap.active_jobs.empty());
  EXPECT_EQ(snap.max_job_id, 0);
}

TYPED_TEST(StoreContract, LoadReturnsNodesAndOnlyActiveJobs) {
  model::Node b = node("gpu-b", 2);
  b.simulated = true;
  b.state = model::NodeState::Drained;
  b.reason = "preflight: GPU 1 not visible";
  this->commit_ok(change(UpsertNode{b}, UpsertNode{node("gpu-a", 8)}));
  JobRecord run = running(2, alloc("gpu-a", {0, 1}, "10.0.0.5", 29500));
  this->insert(pending(1));
  this->insert(run);
  this->insert(ended(pending(3), JobState::Cancelled));

  Snapshot snap = this->snapshot();
  EXPECT_EQ(snap.nodes, (std::vector<model::Node>{node("gpu-a", 8), b}));
  EXPECT_EQ(snap.active_jobs, (std::vector<JobRecord>{pending(1), run}));
}

TYPED_TEST(StoreContract, MaxJobIdCountsTerminalJobsToo) {
  this->insert(pending(4));
  this->insert(ended(pending(17), JobState::Completed));
  this->insert(ended(pending(11), JobState::Timeout));
  EXPECT_EQ(this->snapshot().max_job_id, 17);
}

TYPED_TEST(StoreContract, UpsertNodeReplacesTheNode) {
  this->commit_ok(change(UpsertNode{node("gpu-a", 8)}));
  model::Node down = node("gpu-a", 4);
  down.state = model::NodeState::Down;
  down.reason = "no heartbeat for 10s";
  down.address = "192.168.1.9";
  down.ports = {40000, 40010};
  this->commit_ok(change(UpsertNode{down}));
  EXPECT_EQ(this->snapshot().nodes, std::vector<model::Node>{down});
}

// ---- GPU and port holds ----

TYPED_TEST(StoreContract, SecondJobOnAHeldGpuIsConflictNamingTheGpu) {
  this->insert(pending(1));
  this->insert(pending(2));
  this->update(running(1, alloc("gpu-a", {0, 1}, "10.0.0.1", 29500)));
  JobRecord second = running(2, alloc("gpu-a", {1, 2}, "10.0.0.1", 29501));
  auto r = this->store_->commit(change(UpdateJob{second}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  EXPECT_THAT(r.error().message(), HasSubstr("GPU 1 on node gpu-a is held by job 1"));
  EXPECT_EQ(this->read(2), pending(2));  // the failed update is not half-applied
}

TYPED_TEST(StoreContract, SecondJobOnAHeldHostPortIsConflictNamingThePort) {
  this->insert(pending(1));
  this->insert(pending(2));
  this->update(running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500)));
  auto r = this->store_->commit(change(UpdateJob{running(2, alloc("gpu-b", {0}, "10.0.0.1", 29500))}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  EXPECT_THAT(r.error().message(), HasSubstr("port 29500 on host 10.0.0.1 is held by job 1"));
  EXPECT_EQ(this->read(2), pending(2));
  // The GPU the failed update would have taken is still free.
  this->update(running(2, alloc("gpu-b", {0}, "10.0.0.1", 29501)));
}

TYPED_TEST(StoreContract, SamePortOnAnotherHostIsFree) {
  this->insert(pending(1));
  this->insert(pending(2));
  this->update(running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500)));
  this->update(running(2, alloc("gpu-b", {0}, "10.0.0.2", 29500)));
}

TYPED_TEST(StoreContract, InsertingARunningJobHoldsItsResources) {
  this->insert(running(1, alloc("gpu-a", {3}, "10.0.0.1", 29500)));
  auto r = this->store_->commit(change(InsertJob{running(2, alloc("gpu-a", {3}, "10.0.0.1", 29600))}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  EXPECT_EQ(this->read(2), std::nullopt);
}

TYPED_TEST(StoreContract, TerminalStateReleasesGpusAndPorts) {
  model::JobId id = 0;
  // Each end state in turn frees the same GPUs and port for the next job.
  JobRecord holder = running(++id, alloc("gpu-a", {0, 1}, "10.0.0.1", 29500));
  this->insert(holder);
  for (JobState end :
       {JobState::Completed, JobState::Failed, JobState::Cancelled, JobState::Timeout, JobState::NodeFail}) {
    SCOPED_TRACE(std::string(model::to_string(end)));
    this->update(ended(holder, end));
    // Kept after the end so `corral show` can say where it ran, yet held no more.
    EXPECT_TRUE(this->read(holder.id)->allocation.has_value());
    holder = running(++id, alloc("gpu-a", {1, 0}, "10.0.0.1", 29500));
    this->insert(holder);
  }
}

TYPED_TEST(StoreContract, RequeueToPendingReleasesGpusAndPorts) {
  JobRecord first = running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500));
  this->insert(first);
  this->insert(pending(2));
  JobRecord requeued = first;
  requeued.state = JobState::Pending;
  requeued.attempt = 1;
  this->update(requeued);
  this->update(running(2, alloc("gpu-a", {0}, "10.0.0.1", 29500)));
}

TYPED_TEST(StoreContract, EndingJobKeepsItsHoldsUntilEachNodeIsConfirmedGone) {
  model::Allocation two{{{"gpu-a", {0}}, {"gpu-b", {0}}}, "10.0.0.1", 29500};
  JobRecord job = running(1, two);
  job.ranks = {{0, "gpu-a", 0, {0}, {}, 10, model::RankState::Running, std::nullopt, std::nullopt},
               {1, "gpu-b", 0, {0}, {}, 11, model::RankState::Running, std::nullopt, std::nullopt}};
  this->insert(job);
  job.state = JobState::Ending;
  job.outcome = JobState::Cancelled;
  this->update(job);
  EXPECT_EQ(this->read(1)->outcome, JobState::Cancelled);
  auto b_taken = this->store_->commit(change(InsertJob{running(2, alloc("gpu-b", {0}, "10.0.0.2", 29500))}));
  ASSERT_FALSE(b_taken.has_value());
  EXPECT_THAT(b_taken.error().message(), HasSubstr("held by job 1"));
  // gpu-b's agent confirms: its GPU is free; the port lives on gpu-a, still held.
  job.ranks[1].state = model::RankState::Killed;
  job.ranks[1].gone = true;
  this->update(job);
  this->insert(running(2, alloc("gpu-b", {0}, "10.0.0.2", 29500)));
  auto port_taken = this->store_->commit(change(InsertJob{running(3, alloc("gpu-c", {0}, "10.0.0.1", 29500))}));
  ASSERT_FALSE(port_taken.has_value());
  EXPECT_THAT(port_taken.error().message(), HasSubstr("port 29500 on host 10.0.0.1 is held by job 1"));
  EXPECT_TRUE(this->read(1)->ranks[1].gone);
}

TYPED_TEST(StoreContract, FencesHoldWhateverTheJobsStateAndLoadWithTheJob) {
  JobRecord job = running(1, alloc("gpu-a", {0, 1}, "10.0.0.1", 29500));
  this->insert(job);
  // Its node was lost before confirming; the job ended NODE_FAIL and its GPUs and port
  // are fenced.
  job = ended(job, JobState::NodeFail);
  job.fences = {{0, "gpu-a", {0, 1}, "10.0.0.1", 29500}};
  this->update(job);
  auto taken = this->store_->commit(change(InsertJob{running(2, alloc("gpu-a", {1}, "10.0.0.1", 29501))}));
  ASSERT_FALSE(taken.has_value());
  EXPECT_THAT(taken.error().message(), HasSubstr("held by job 1"));
  auto snap = this->store_->load();
  ASSERT_TRUE(snap.has_value());
  ASSERT_EQ(snap->active_jobs.size(), 1u);  // ended, but its fences must come back
  EXPECT_EQ(snap->active_jobs[0].fences, job.fences);
  // The agent confirms: the fence goes, and with it the holds.
  job.fences.clear();
  this->update(job);
  this->insert(running(2, alloc("gpu-a", {1}, "10.0.0.1", 29500)));
  EXPECT_TRUE(this->store_->load()->active_jobs.size() == 1u);  // job 2 only
}

TYPED_TEST(StoreContract, NewAllocationReplacesTheOldHolds) {
  JobRecord job = running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500));
  job.state = JobState::Starting;
  this->insert(job);
  // PREPARE found the port busy: the coordinator moves the job to another port.
  job.allocation->master_port = 29501;
  this->update(job);
  this->insert(running(2, alloc("gpu-b", {0}, "10.0.0.1", 29500)));
  // Updating a job to the allocation it already holds is not a conflict with itself.
  job.state = JobState::Running;
  this->update(job);
}

TYPED_TEST(StoreContract, AllocationWithoutAMasterPortHoldsOnlyGpus) {
  this->insert(running(1, alloc("gpu-a", {0}, "10.0.0.1", 0)));
  this->insert(running(2, alloc("gpu-a", {1}, "10.0.0.1", 0)));
  auto r = this->store_->commit(change(InsertJob{running(3, alloc("gpu-a", {1}, "10.0.0.1", 29500))}));
  ASSERT_FALSE(r.has_value());
  EXPECT_THAT(r.error().message(), HasSubstr("GPU 1 on node gpu-a is held by job 2"));
}

TYPED_TEST(StoreContract, RunningJobWithoutAllocationIsInvalidArgument) {
  this->insert(pending(1));
  JobRecord job = pending(1);
  job.state = JobState::Starting;
  auto r = this->store_->commit(change(UpdateJob{job}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
}

TYPED_TEST(StoreContract, GpuListedTwiceInOneAllocationIsInvalidArgument) {
  this->insert(pending(1));
  auto r = this->store_->commit(change(UpdateJob{running(1, alloc("gpu-a", {2, 2}, "10.0.0.1", 29500))}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
  EXPECT_THAT(r.error().message(), HasSubstr("GPU 2 on node gpu-a appears twice"));
}

// ---- atomicity and batches ----

TYPED_TEST(StoreContract, EmptyBatchReturnsNoResults) {
  EXPECT_TRUE(this->store_->commit(std::span<const Change>()).empty());
}

TYPED_TEST(StoreContract, FailingChangeInABatchIsRolledBackAloneAndTheOthersApply) {
  this->insert(running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500)));
  this->insert(pending(2));
  std::vector<Change> batch;
  batch.push_back(change(InsertJob{pending(3)}, AppendEvent{event(3, 1, "submitted")}));
  // Fails at its last mutation: its event and its upserted node must vanish with it.
  batch.push_back(change(AppendEvent{event(2, 2, "PENDING -> RUNNING")}, UpsertNode{node("gpu-z", 1)},
                         UpdateJob{running(2, alloc("gpu-a", {0}, "10.0.0.1", 29501))}));
  batch.push_back(change(AppendEvent{event(1, 3, "still running")}));
  batch.push_back(change(UpdateJob{pending(77)}));
  batch.push_back(change(UpsertNode{node("gpu-a", 1)}));

  auto results = this->store_->commit(batch);
  ASSERT_EQ(results.size(), 5u);
  EXPECT_TRUE(results[0].has_value());
  ASSERT_FALSE(results[1].has_value());
  EXPECT_EQ(results[1].error().code(), ErrorCode::Conflict);
  EXPECT_TRUE(results[2].has_value());
  ASSERT_FALSE(results[3].has_value());
  EXPECT_EQ(results[3].error().code(), ErrorCode::NotFound);
  EXPECT_TRUE(results[4].has_value());

  EXPECT_EQ(this->read(3), pending(3));
  EXPECT_EQ(this->events_of(3), std::vector<JobEvent>{event(3, 1, "submitted")});
  EXPECT_EQ(this->read(2), pending(2));
  EXPECT_TRUE(this->events_of(2).empty());
  EXPECT_EQ(this->events_of(1), std::vector<JobEvent>{event(1, 3, "still running")});
  EXPECT_EQ(this->snapshot().nodes, std::vector<model::Node>{node("gpu-a", 1)});
}

TYPED_TEST(StoreContract, FailingChangeUndoesItsEarlierInsertAndHolds) {
  this->insert(running(1, alloc("gpu-a", {5}, "10.0.0.1", 29500)));
  // Inserts a running job 2 (taking gpu-b:0), then collides on gpu-a:5 while inserting 3.
  auto r = this->store_->commit(change(InsertJob{running(2, alloc("gpu-b", {0}, "10.0.0.2", 29500))},
                                       AppendEvent{event(2, 1, "submitted")},
                                       InsertJob{running(3, alloc("gpu-a", {4, 5}, "10.0.0.1", 29501))}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::Conflict);
  EXPECT_EQ(this->read(2), std::nullopt);
  EXPECT_EQ(this->read(3), std::nullopt);
  EXPECT_TRUE(this->events_of(2).empty());
  EXPECT_EQ(this->snapshot().max_job_id, 1);
  // gpu-b:0, gpu-a:4, and port 29501 were never kept.
  this->insert(running(4, alloc("gpu-b", {0}, "10.0.0.2", 29500)));
  this->insert(running(5, alloc("gpu-a", {4}, "10.0.0.1", 29501)));
}

TYPED_TEST(StoreContract, FailedUpdateKeepsTheJobsPreviousHolds) {
  JobRecord one = running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500));
  this->insert(one);
  this->insert(running(2, alloc("gpu-a", {1}, "10.0.0.1", 29501)));
  // Job 1 tries to move onto job 2's GPU: refused, and job 1 still holds GPU 0.
  auto r = this->store_->commit(change(UpdateJob{running(1, alloc("gpu-a", {1}, "10.0.0.1", 29502))}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(this->read(1), one);
  auto taken = this->store_->commit(change(InsertJob{running(3, alloc("gpu-a", {0}, "10.0.0.1", 29503))}));
  ASSERT_FALSE(taken.has_value());
  EXPECT_THAT(taken.error().message(), HasSubstr("held by job 1"));
}

TYPED_TEST(StoreContract, LaterChangeInABatchSeesEarlierOnes) {
  std::vector<Change> batch;
  batch.push_back(change(InsertJob{pending(1)}));
  batch.push_back(change(UpdateJob{running(1, alloc("gpu-a", {0}, "10.0.0.1", 29500))}));
  batch.push_back(change(InsertJob{running(2, alloc("gpu-a", {0}, "10.0.0.1", 29501))}));
  auto results = this->store_->commit(batch);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].has_value());
  EXPECT_TRUE(results[1].has_value());
  ASSERT_FALSE(results[2].has_value());
  EXPECT_EQ(results[2].error().code(), ErrorCode::Conflict);
}

// Two rank reports of one gang: each updates the job and logs an event. Folded, they
// are one write that leaves the record, the events and the holds both in turn would.
TYPED_TEST(StoreContract, TwoUpdatesOfOneJobFoldedLeaveWhatBothInTurnWould) {
  model::Allocation two{{{"gpu-a", {0}}, {"gpu-b", {0}}}, "10.0.0.1", 29500};
  JobRecord job = running(1, two);
  job.state = JobState::Starting;
  job.ranks = {{0, "gpu-a", 0, {0}, {}, 0, model::RankState::Pending, std::nullopt, std::nullopt},
               {1, "gpu-b", 0, {0}, {}, 0, model::RankState::Pending, std::nullopt, std::nullopt}};
  this->insert(job);
  JobRecord first = job;
  first.ranks[0].pid = 10;
  first.ranks[0].state = model::RankState::Running;
  JobRecord second = first;
  second.ranks[1].pid = 11;
  second.ranks[1].state = model::RankState::Running;
  second.state = JobState::Running;
  Change into = change(UpdateJob{first}, AppendEvent{event(1, 5, "rank 0 started")});
  Change next = change(UpdateJob{second}, AppendEvent{event(1, 6, "rank 1 started")},
                       AppendEvent{event(1, 7, "STARTING -> RUNNING")});
  ASSERT_TRUE(fold_job_update(into, next));
  EXPECT_TRUE(next.mutations.empty());
  ASSERT_EQ(into.mutations.size(), 4u);
  this->commit_ok(into);
  EXPECT_EQ(this->read(1), second);
  std::vector<std::string> texts;
  for (const auto& e : this->events_of(1)) texts.push_back(e.text);
  EXPECT_EQ(texts, (std::vector<std::string>{"rank 0 started", "rank 1 started", "STARTING -> RUNNING"}));
  // The folded record's holds are in place: gpu-b's GPU is not free.
  auto taken = this->store_->commit(change(InsertJob{running(2, alloc("gpu-b", {0}, "10.0.0.2", 29500))}));
  ASSERT_FALSE(taken.has_value());
  EXPECT_THAT(taken.error().message(), HasSubstr("held by job 1"));
}

TEST(StoreRules, ChangesOfTwoJobsOrOfMoreThanOneJobDoNotFold) {
  JobRecord a = pending(1);
  JobRecord b = pending(2);
  auto unfolded = [](Change into, Change next) {
    const Change before_into = into;
    const Change before_next = next;
    bool folded = fold_job_update(into, next);
    // Nothing moved.
    return !folded && into.mutations.size() == before_into.mutations.size() &&
           next.mutations.size() == before_next.mutations.size();
  };
  EXPECT_TRUE(unfolded(change(UpdateJob{a}), change(UpdateJob{b})));
  // An event of another job rides along: the change is not job 1's alone.
  EXPECT_TRUE(unfolded(change(UpdateJob{a}, AppendEvent{event(2, 1, "x")}), change(UpdateJob{a})));
  EXPECT_TRUE(unfolded(change(UpdateJob{a}), change(UpdateJob{a}, UpdateJob{b})));
  // An insert is not an update, nor an event alone, nor a node.
  EXPECT_TRUE(unfolded(change(InsertJob{a}), change(UpdateJob{a})));
  EXPECT_TRUE(unfolded(change(AppendEvent{event(1, 1, "x")}), change(UpdateJob{a})));
  EXPECT_TRUE(unfolded(change(UpdateJob{a}), change(UpsertNode{node("gpu-a", 1)})));
  EXPECT_TRUE(unfolded(change(), change(UpdateJob{a})));
}

TYPED_TEST(StoreContract, UserChangesInAFailingChangeOfABatchAreRolledBackWithIt) {
  this->upsert(user("alice", 'a'));
  this->insert(pending(1));
  std::vector<Change> batch;
  batch.push_back(change(UpsertUser{user("carol", 'c')}));
  // Fails at its last mutation: alice's new token and admin flag, and dave, go with it.
  batch.push_back(change(UpsertUser{user("alice", 'b', true)}, UpsertUser{user("dave", 'd')},
                         AppendEvent{event(1, 1, "token rotated")}, UpdateJob{pending(999)}));
  batch.push_back(change(UpsertUser{user("erin", 'e')}));
  auto results = this->store_->commit(batch);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].has_value());
  ASSERT_FALSE(results[1].has_value());
  EXPECT_EQ(results[1].error().code(), ErrorCode::NotFound);
  EXPECT_TRUE(results[2].has_value());

  EXPECT_EQ(this->all_users(),
            (std::vector<User>{user("alice", 'a'), user("carol", 'c'), user("erin", 'e')}));
  EXPECT_EQ(this->by_hash(hash_of('a')), user("alice", 'a'));
  EXPECT_EQ(this->by_hash(hash_of('b')), std::nullopt);
  EXPECT_EQ(this->by_hash(hash_of('d')), std::nullopt);
  EXPECT_TRUE(this->events_of(1).empty());
  // The token the failed change would have given alice is still free.
  this->upsert(user("frank", 'b'));
}


// ---- submit keys ----

SubmitKey submit_key(const std::string& user, const std::string& key, model::JobId job, int jobs, std::int64_t ms) {
  return {user, key, job, jobs, at(ms)};
}

TYPED_TEST(StoreContract, ASubmitKeyIsRecordedWithItsJobsAndFoundByUserAndKey) {
  auto key = submit_key("ada", "k-1", 7, 3, 1'700'000'000'000);
  std::vector<Mutation> made;
  for (model::JobId id : {7, 8, 9}) made.emplace_back(InsertJob{pending(id)});
  made.emplace_back(RecordSubmitKey{key});
  this->commit_ok(Change{made});
  auto found = this->store_->submit_key("ada", "k-1");
  ASSERT_TRUE(found.has_value()) << found.error().to_string();
  EXPECT_EQ(*found, key);
  // The key is the user's: another user's same key, or another key, finds nothing.
  EXPECT_EQ(this->store_->submit_key("bob", "k-1").value(), std::nullopt);
  EXPECT_EQ(this->store_->submit_key("ada", "k-2").value(), std::nullopt);
}

TYPED_TEST(StoreContract, ARepeatedSubmitKeyIsRefusedAndItsChangeMakesNoJob) {
  this->commit_ok(change(InsertJob{pending(1)}, RecordSubmitKey{submit_key("ada", "k", 1, 1, 5)}));
  auto again = this->store_->commit(change(InsertJob{pending(2)}, RecordSubmitKey{submit_key("ada", "k", 2, 1, 6)}));
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code(), ErrorCode::Conflict);
  EXPECT_THAT(again.error().message(), HasSubstr("ada"));
  EXPECT_EQ(this->read(2), std::nullopt);
  EXPECT_EQ(this->store_->submit_key("ada", "k").value(), submit_key("ada", "k", 1, 1, 5));
  // Bob's "k" is his own.
  this->commit_ok(change(InsertJob{pending(3, "bob")}, RecordSubmitKey{submit_key("bob", "k", 3, 1, 7)}));
  EXPECT_EQ(this->store_->submit_key("bob", "k").value(), submit_key("bob", "k", 3, 1, 7));
}

TYPED_TEST(StoreContract, ASubmitKeyForAMissingJobOrWithoutAUserKeyOrJobIsRefused) {
  auto missing = this->store_->commit(change(RecordSubmitKey{submit_key("ada", "k", 5, 1, 1)}));
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), ErrorCode::NotFound);
  this->insert(pending(1));
  for (const auto& bad :
       {submit_key("", "k", 1, 1, 1), submit_key("ada", "", 1, 1, 1), submit_key("ada", "k", 1, 0, 1)}) {
    auto r = this->store_->commit(change(RecordSubmitKey{bad}));
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument);
  }
  EXPECT_EQ(this->store_->submit_key("ada", "k").value(), std::nullopt);
}

TYPED_TEST(StoreContract, PruningDeletesTheOldestKeysBeforeTheTimeUpToItsLimit) {
  std::vector<Mutation> made;
  for (int i = 1; i <= 5; ++i) {
    made.emplace_back(InsertJob{pending(i)});
    made.emplace_back(RecordSubmitKey{submit_key("ada", "k" + std::to_string(i), i, 1, 1000 * i)});
  }
  this->commit_ok(Change{made});
  auto known = [&] {
    std::vector<int> out;
    for (int i = 1; i <= 5; ++i) {
      if (this->store_->submit_key("ada", "k" + std::to_string(i)).value()) out.push_back(i);
    }
    return out;
  };
  // Made before 4000: k1, k2, k3; at most two go, the oldest.
  this->commit_ok(change(PruneSubmitKeys{at(4000), 2}));
  EXPECT_EQ(known(), (std::vector<int>{3, 4, 5}));
  this->commit_ok(change(PruneSubmitKeys{at(4000), 100}));
  EXPECT_EQ(known(), (std::vector<int>{4, 5}));
  // The jobs stay; only their keys went.
  EXPECT_TRUE(this->read(1).has_value());
  // A pruned key is free again.
  this->commit_ok(change(InsertJob{pending(6)}, RecordSubmitKey{submit_key("ada", "k1", 6, 1, 9000)}));
  EXPECT_EQ(this->store_->submit_key("ada", "k1").value(), submit_key("ada", "k1", 6, 1, 9000));
}

TYPED_TEST(StoreContract, APruneInAFailingChangeIsUndoneWithIt) {
  this->commit_ok(change(InsertJob{pending(1)}, RecordSubmitKey{submit_key("ada", "k", 1, 1, 10)}));
  auto r = this->store_->commit(change(PruneSubmitKeys{at(100), 10}, UpdateJob{pending(999)}));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(this->store_->submit_key("ada", "k").value(), submit_key("ada", "k", 1, 1, 10));
}

}  // namespace
}  // namespace corral::store
