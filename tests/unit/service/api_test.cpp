// The coordinator service's HTTP API alone: requests handed to on_http, a MemoryStore as
// its disk, a clock the test moves, an event loop polled by the test. No socket, no
// process: what it answers, and what it stores, for good and bad requests.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <future>
#include <optional>
#include <thread>

#include "common/net/pki.hpp"
#include "coordinator/service/coordinator.hpp"
#include "coordinator/store/memory_store.hpp"
#include "tests/support/fake_clock.hpp"

namespace corral::service {
namespace {

using Json = nlohmann::json;

using testing::FakeClock;

constexpr const char* kSpec = "name: t\ncommand: [true]\nresources: {nodes: 2, gpus_per_node: 2}\n";

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::Change users;
    users.mutations.emplace_back(store::UpsertUser{{"alice", net::sha256_hex("alice-token"), false}});
    users.mutations.emplace_back(store::UpsertUser{{"root", net::sha256_hex("admin-token"), true}});
    ASSERT_TRUE(store_.commit(users).has_value());
    coord_ = std::make_unique<Coordinator>(loop_, clock_, store_, model::CoordinatorConfig{});
    ASSERT_TRUE(coord_->start().has_value());
  }
  void TearDown() override { coord_->shutdown(); }

  net::HttpResponse call(const std::string& method, const std::string& target, const std::string& body = "",
                         const std::string& token = "alice-token") {
    net::HttpRequest r;
    r.method = method;
    r.target = target;
    EXPECT_TRUE(net::parse_target(target, r.path, r.query));
    r.body = body;
    if (!token.empty()) r.headers["authorization"] = "Bearer " + token;
    return answer_to(r);
  }
  net::HttpResponse answer_to(const net::HttpRequest& r) {
    std::optional<net::HttpResponse> answer;
    coord_->on_http(r, [&](net::HttpResponse a) { answer = std::move(a); });
    // An answer that reports a change comes once it is committed: after the loop's turn.
    for (int i = 0; i < 100 && !answer; ++i) loop_.poll();
    EXPECT_TRUE(answer.has_value()) << r.method << " " << r.target << " was never answered";
    return answer.value_or(net::HttpResponse{0, "", "", {}});
  }

  // POST /v1/jobs as alice, with the Idempotency-Key header.
  static net::HttpRequest keyed_submit(const std::string& key, const std::string& spec = kSpec) {
    net::HttpRequest r;
    r.method = "POST";
    r.target = r.path = "/v1/jobs";
    r.body = Json{{"spec", spec}}.dump();
    r.headers["authorization"] = "Bearer alice-token";
    r.headers["idempotency-key"] = key;
    return r;
  }

  model::JobId stored_jobs() { return store_.load().value().max_job_id; }  // ids start at 1

  net::EventLoop loop_;
  FakeClock clock_;
  store::MemoryStore store_;
  std::unique_ptr<Coordinator> coord_;
};

TEST_F(ApiTest, NoOrAnUnknownTokenIs401AndChangesNothing) {
  EXPECT_EQ(call("POST", "/v1/jobs", Json{{"spec", kSpec}}.dump(), "").status, 401);
  EXPECT_EQ(call("POST", "/v1/jobs", Json{{"spec", kSpec}}.dump(), "nope").status, 401);
  EXPECT_EQ(stored_jobs(), 0);
}

TEST_F(ApiTest, ASubmitIsStoredWithWhereAndWithWhatItWasSubmittedBeforeItIsAcknowledged) {
  auto r = call("POST", "/v1/jobs",
                Json{{"spec", kSpec},
                     {"submit_dir", "/home/alice/run"},
                     {"environment", Json::array({Json::array({"HF_HOME", "/data/hf"})})}}
                    .dump());
  ASSERT_EQ(r.status, 201) << r.body;
  auto id = Json::parse(r.body)["id"].get<model::JobId>();
  auto stored = store_.job(id).value();
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->user, "alice");
  EXPECT_EQ(stored->submission.dir, "/home/alice/run");
  EXPECT_EQ(stored->submission.env, (model::EnvList{{"HF_HOME", "/data/hf"}}));
  auto shown = Json::parse(call("GET", "/v1/jobs/" + std::to_string(id)).body);
  EXPECT_EQ(shown["state"], "PENDING");  // no agent joined
}

TEST_F(ApiTest, BadRequestsNameTheFieldAndChangeNothing) {
  struct Case {
    std::string body;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"{", "malformed JSON"},
      {Json{{"spec", 5}}.dump(), "spec"},
      {Json{{"spec", "name: t\n"}}.dump(), "invalid job spec"},
      {Json{{"spec", kSpec}, {"submit_dir", "relative"}}.dump(), "submit_dir: must be an absolute path"},
      {Json{{"spec", kSpec}, {"environment", Json::array({"A=1"})}}.dump(),
       "environment[0]: must be a [name, value] pair of strings"},
      {Json{{"spec", kSpec}, {"environment", Json::array({Json::array({"CORRAL_TOKEN", "x"})})}}.dump(),
       "environment[0]: variable CORRAL_TOKEN cannot travel"},
  };
  for (const auto& c : cases) {
    auto r = call("POST", "/v1/jobs", c.body);
    EXPECT_EQ(r.status, 400) << c.body;
    EXPECT_NE(r.body.find(c.says), std::string::npos) << c.body << " -> " << r.body;
  }
  EXPECT_EQ(stored_jobs(), 0);
}

TEST_F(ApiTest, OnlyTheOwnerOrAnAdminCancelsAndTheEndSaysWhoInWords) {
  auto r = call("POST", "/v1/jobs", Json{{"spec", kSpec}}.dump(), "admin-token");
  ASSERT_EQ(r.status, 201);
  std::string id = std::to_string(Json::parse(r.body)["id"].get<model::JobId>());
  EXPECT_EQ(call("POST", "/v1/jobs/" + id + "/cancel").status, 403);  // alice's token, root's job
  auto cancelled = call("POST", "/v1/jobs/" + id + "/cancel", "", "admin-token");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  auto j = Json::parse(call("GET", "/v1/jobs/" + id).body);
  EXPECT_EQ(j["state"], "CANCELLED");  // never placed: nothing to wait for
  EXPECT_EQ(j["detail"], "cancelled by root");
  EXPECT_EQ(store_.job(std::stoll(id)).value()->state, model::JobState::Cancelled);
}

TEST_F(ApiTest, CancellingAnArrayOfMoreElementsThanTheLedgerKeepsEndedAnswersWithItsFirstElement) {
  // 5,000 pending elements end at once: more than the 4,096 ended jobs kept in memory,
  // so the first is gone from it before the answer is written (it was a null pointer).
  std::string spec = std::string(kSpec) + "array: \"0-4999\"\n";
  auto r = call("POST", "/v1/jobs", Json{{"spec", spec}}.dump());
  ASSERT_EQ(r.status, 201) << r.body;
  auto id = Json::parse(r.body)["id"].get<model::JobId>();
  auto cancelled = call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  auto j = Json::parse(cancelled.body);
  EXPECT_EQ(j["id"], id);
  EXPECT_EQ(j["state"], "CANCELLED");
  EXPECT_EQ(j["array_cancelled"].size(), 5000u);
  EXPECT_EQ(store_.job(id + 4999).value()->state, model::JobState::Cancelled);

  // An array whose first element ended before: shown as it ended, the rest cancelled.
  r = call("POST", "/v1/jobs", Json{{"spec", std::string(kSpec) + "array: \"0-2\"\n"}}.dump());
  ASSERT_EQ(r.status, 201) << r.body;
  id = Json::parse(r.body)["id"].get<model::JobId>();
  // 42_0 is element 0 alone, as scancel reads it; 42 then is the rest.
  auto first = call("POST", "/v1/jobs/" + std::to_string(id) + "_0/cancel");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_FALSE(Json::parse(first.body).contains("array_cancelled")) << first.body;
  EXPECT_EQ(store_.job(id + 1).value()->state, model::JobState::Pending);
  cancelled = call("POST", "/v1/jobs/" + std::to_string(id) + "/cancel");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  j = Json::parse(cancelled.body);
  EXPECT_EQ(j["id"], id);
  EXPECT_EQ(j["state"], "CANCELLED");
  EXPECT_EQ(j["array_cancelled"], Json::array({id + 1, id + 2}));

  // In one request too: "ID_0" is the element, a filter's match is the job it matched.
  r = call("POST", "/v1/jobs", Json{{"spec", std::string(kSpec) + "array: \"0-2\"\n"}}.dump());
  ASSERT_EQ(r.status, 201) << r.body;
  id = Json::parse(r.body)["id"].get<model::JobId>();
  auto bulk = call("POST", "/v1/jobs/cancel", Json{{"ids", Json::array({std::to_string(id) + "_0"})}}.dump());
  ASSERT_EQ(bulk.status, 200) << bulk.body;
  EXPECT_EQ(Json::parse(bulk.body)["cancelled"].size(), 1u) << bulk.body;
  EXPECT_EQ(store_.job(id + 1).value()->state, model::JobState::Pending);
  bulk = call("POST", "/v1/jobs/cancel", Json{{"ids", Json::array({id + 1})}}.dump());
  EXPECT_EQ(Json::parse(bulk.body)["cancelled"].size(), 1u) << bulk.body;  // an element's own id
  EXPECT_EQ(store_.job(id + 2).value()->state, model::JobState::Pending);
}

TEST_F(ApiTest, TheBearerSchemeIsCaseInsensitiveAndTwoAuthorizationHeadersAreRefused) {
  net::HttpRequest r;
  r.method = "GET";
  r.target = r.path = "/v1/jobs";
  r.headers["authorization"] = "bearer alice-token";
  std::optional<net::HttpResponse> answer;
  coord_->on_http(r, [&](net::HttpResponse a) { answer = std::move(a); });
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status, 200) << answer->body;
  r.headers["authorization"] = "BEARER alice-token";
  coord_->on_http(r, [&](net::HttpResponse a) { answer = std::move(a); });
  EXPECT_EQ(answer->status, 200) << answer->body;
  r.repeated_headers = {"authorization"};  // a second one came; the map keeps the last
  coord_->on_http(r, [&](net::HttpResponse a) { answer = std::move(a); });
  EXPECT_EQ(answer->status, 401);
  EXPECT_NE(answer->body.find("more than one Authorization header"), std::string::npos) << answer->body;
}

TEST_F(ApiTest, ALogsRankBeyondAnIntIsRefusedNotWrappedToRankZero) {
  auto r = call("POST", "/v1/jobs", Json{{"spec", kSpec}}.dump());
  ASSERT_EQ(r.status, 201);
  std::string id = std::to_string(Json::parse(r.body)["id"].get<model::JobId>());
  auto logs = call("GET", "/v1/jobs/" + id + "/logs?rank=4294967296");
  EXPECT_EQ(logs.status, 400) << logs.body;
  EXPECT_NE(logs.body.find("rank: 4294967296 is not a rank"), std::string::npos) << logs.body;
}

TEST_F(ApiTest, AnUnknownJobIs404ABadIdIs400AndAWrongMethodIs405) {
  EXPECT_EQ(call("GET", "/v1/jobs/99?wait=5").status, 404);  // answered at once, not held
  EXPECT_EQ(call("GET", "/v1/jobs/abc").status, 400);
  EXPECT_EQ(call("DELETE", "/v1/jobs").status, 405);
}

// A Store that reads from another and holds its reads of ended jobs until let go: a month
// of history that takes its time.
class HeldReads final : public store::Store {
 public:
  explicit HeldReads(store::Store& under) : under_(under) {}
  void let_go() { gate_.set_value(); }

  std::vector<Result<void>> commit(std::span<const store::Change> changes) override { return under_.commit(changes); }
  Result<store::Snapshot> load() override { return under_.load(); }
  Result<std::optional<store::JobRecord>> job(model::JobId id) override { return under_.job(id); }
  Result<std::optional<model::JobId>> array_element(model::JobId array, int index) override {
    return under_.array_element(array, index);
  }
  Result<std::vector<store::JobRecord>> jobs(const store::JobQuery& q) override { return under_.jobs(q); }
  // (Read on the loop's own thread, they would hold the test: they give up after a while.)
  Result<std::vector<store::JobRecord>> ended_jobs(const store::EndedQuery& q) override {
    opened_.wait_for(std::chrono::seconds(5));
    return under_.ended_jobs(q);
  }
  Result<std::vector<store::UsageRow>> gpu_usage(const store::EndedQuery& q, store::UsageKey by) override {
    opened_.wait_for(std::chrono::seconds(5));
    return under_.gpu_usage(q, by);
  }
  Result<std::vector<store::JobEvent>> events(model::JobId id) override { return under_.events(id); }
  Result<std::optional<store::User>> user_by_token_hash(const std::string& h) override {
    return under_.user_by_token_hash(h);
  }
  Result<std::vector<store::User>> users() override { return under_.users(); }
  Result<std::optional<store::SubmitKey>> submit_key(const std::string& user, const std::string& key) override {
    return under_.submit_key(user, key);
  }

 private:
  store::Store& under_;
  std::promise<void> gate_;
  std::shared_future<void> opened_ = gate_.get_future().share();
};

// History and usage are read on a thread of their own: while one is being read, the loop
// answers everything else; the answer comes once the read is done.
TEST_F(ApiTest, AHistoryReadThatTakesItsTimeHoldsNoOtherRequest) {
  auto reader = std::make_shared<HeldReads>(store_);
  coord_->read_history_from(reader);
  std::optional<net::HttpResponse> history;
  std::optional<net::HttpResponse> usage;
  auto ask = [&](const std::string& target, std::optional<net::HttpResponse>& answer) {
    net::HttpRequest r;
    r.method = "GET";
    r.target = target;
    ASSERT_TRUE(net::parse_target(target, r.path, r.query));
    r.headers["authorization"] = "Bearer alice-token";
    coord_->on_http(r, [&](net::HttpResponse a) {
      answer = std::move(a);
      if (history && usage) loop_.stop();
    });
  };
  ask("/v1/history", history);
  ask("/v1/usage?by=node", usage);
  // Meanwhile: a submit, a listing and who-am-I are answered.
  auto submitted = call("POST", "/v1/jobs", Json{{"spec", kSpec}}.dump());
  EXPECT_EQ(submitted.status, 201) << submitted.body;
  EXPECT_EQ(call("GET", "/v1/jobs").status, 200);
  EXPECT_EQ(call("GET", "/v1/whoami").status, 200);
  EXPECT_FALSE(history.has_value());
  EXPECT_FALSE(usage.has_value());
  // A bad request is refused at once, without a read.
  std::optional<net::HttpResponse> bad;
  ask("/v1/usage?by=gpu", bad);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->status, 400);
  // The answers come back on the loop once the reads are done; the loop runs until the
  // second is in, or gives up after 10 s.
  reader->let_go();
  net::Timer give_up(loop_);
  give_up.start(std::chrono::seconds(10), [&] { loop_.stop(); });
  loop_.run();
  give_up.cancel();
  ASSERT_TRUE(history.has_value());
  ASSERT_TRUE(usage.has_value());
  EXPECT_EQ(history->status, 200) << history->body;
  EXPECT_TRUE(Json::parse(history->body).is_array());
  EXPECT_EQ(usage->status, 200) << usage->body;
  EXPECT_EQ(Json::parse(usage->body)["by"], "node");
}


TEST_F(ApiTest, ASubmitRepeatedWithItsKeyIsAnsweredWithTheSameJobAndMakesNone) {
  auto first = answer_to(keyed_submit("k-1"));
  ASSERT_EQ(first.status, 201) << first.body;
  auto again = answer_to(keyed_submit("k-1"));
  ASSERT_EQ(again.status, 201) << again.body;
  auto a = Json::parse(first.body);
  auto b = Json::parse(again.body);
  EXPECT_EQ(b["id"], a["id"]);
  EXPECT_EQ(b["ids"], a["ids"]);
  EXPECT_FALSE(a.contains("repeated"));
  EXPECT_EQ(b["repeated"], true);
  EXPECT_EQ(stored_jobs(), 1);
  // Another key is another submission.
  EXPECT_NE(Json::parse(answer_to(keyed_submit("k-2")).body)["id"], a["id"]);
  EXPECT_EQ(stored_jobs(), 2);
}

// The retry comes while the first submission waits in the loop's commit batch: it is not
// in the store yet, and still makes no second job.
TEST_F(ApiTest, ARetryThatArrivesBeforeTheFirstIsCommittedWaitsForItAndGetsTheSameJob) {
  std::optional<net::HttpResponse> first;
  std::optional<net::HttpResponse> retry;
  coord_->on_http(keyed_submit("k"), [&](net::HttpResponse a) { first = std::move(a); });
  coord_->on_http(keyed_submit("k"), [&](net::HttpResponse a) { retry = std::move(a); });
  EXPECT_FALSE(first.has_value());  // answered after the commit, not before
  EXPECT_FALSE(retry.has_value());
  for (int i = 0; i < 100 && !(first && retry); ++i) loop_.poll();
  ASSERT_TRUE(first && retry);
  ASSERT_EQ(first->status, 201) << first->body;
  ASSERT_EQ(retry->status, 201) << retry->body;
  EXPECT_EQ(Json::parse(retry->body)["id"], Json::parse(first->body)["id"]);
  EXPECT_EQ(Json::parse(retry->body)["repeated"], true);
  EXPECT_EQ(stored_jobs(), 1);
  // Committed, the key is let go from memory: the next retry reads it from the store.
  EXPECT_EQ(Json::parse(answer_to(keyed_submit("k")).body)["id"], Json::parse(first->body)["id"]);
  EXPECT_EQ(stored_jobs(), 1);
}

TEST_F(ApiTest, AnArraysRepeatedSubmitIsAnsweredWithEveryElement) {
  std::string spec = std::string(kSpec) + "array: \"0-2\"\n";
  auto first = answer_to(keyed_submit("arr", spec));
  ASSERT_EQ(first.status, 201) << first.body;
  auto again = answer_to(keyed_submit("arr", spec));
  ASSERT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(Json::parse(again.body)["ids"], Json::parse(first.body)["ids"]);
  EXPECT_EQ(Json::parse(again.body)["ids"].size(), 3u);
  EXPECT_EQ(stored_jobs(), 3);
}

TEST_F(ApiTest, ABadIdempotencyKeyIs400NamingTheHeaderAndMakesNoJob) {
  for (const std::string& key : {std::string(), std::string(129, 'a'), std::string("has space"),
                                 std::string("tab\tkey"), std::string("caf\xc3\xa9")}) {
    auto r = answer_to(keyed_submit(key));
    EXPECT_EQ(r.status, 400) << key;
    EXPECT_NE(r.body.find("Idempotency-Key"), std::string::npos) << r.body;
  }
  auto twice = keyed_submit("k");
  twice.repeated_headers.push_back("idempotency-key");
  auto r = answer_to(twice);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("Idempotency-Key: given more than once"), std::string::npos) << r.body;
  EXPECT_EQ(stored_jobs(), 0);
  EXPECT_EQ(answer_to(keyed_submit(std::string(128, '~'))).status, 201);
}

}  // namespace
}  // namespace corral::service
