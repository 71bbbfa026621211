// The commands against a scripted fake API: what they ask, what they print, and the
// exit code, with a fake clock so that polling takes no real time.

#include "cli/commands.hpp"

#include <deque>
#include <fstream>
#include <sstream>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/app.hpp"
#include "cli/exit_codes.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/fake_clock.hpp"

namespace corral::cli {
namespace {

using namespace std::chrono_literals;

struct Call {
  std::string method;
  std::string target;
  std::string body;
  ApiHeaders headers = {};
};

// Answers calls from a script, in order, and records them.
class FakeApi : public ApiClient {
 public:
  void answer(int status, std::string body) { script_.push_back(ApiResponse{status, std::move(body)}); }
  void fail(ErrorCode code, std::string message) { script_.push_back(Error(code, std::move(message))); }

  Result<ApiResponse> call(const std::string& method, const std::string& target, const std::string& body,
                           const ApiHeaders& headers) override {
    calls.push_back({method, target, body, headers});
    if (script_.empty()) return make_error(ErrorCode::Internal, "the test scripted no answer for " + target);
    auto next = std::move(script_.front());
    script_.pop_front();
    if (auto* e = std::get_if<Error>(&next)) return std::unexpected(*e);
    return std::get<ApiResponse>(next);
  }

  std::vector<Call> calls;

 private:
  std::deque<std::variant<ApiResponse, Error>> script_;
};

using testing::FakeClock;

// Options as a command line would give them, every field set.
CancelOptions cancel_jobs(std::vector<std::string> jobs) {
  CancelOptions o;
  o.jobs = std::move(jobs);
  return o;
}
CancelOptions cancel_by(std::vector<std::string> users, std::vector<std::string> states) {
  CancelOptions o;
  o.users = std::move(users);
  o.states = std::move(states);
  return o;
}
QueueOptions queue_of(std::vector<std::string> users, bool all) {
  QueueOptions o;
  o.users = std::move(users);
  o.all = all;
  return o;
}
QueueOptions queue_json() {
  QueueOptions o;
  o.json = true;
  return o;
}

class CommandsTest : public ::testing::Test {
 protected:
  CommandContext ctx() {
    return CommandContext{api_, out_, err_, clock_, [this](Duration d) {
                            sleeps_.push_back(d);
                            clock_.advance(d);
                          }};
  }
  std::string write_spec(const std::string& text) {
    std::string path = dir_.file("job.yaml");
    std::ofstream(path) << text;
    return path;
  }

  FakeApi api_;
  FakeClock clock_;
  std::ostringstream out_;
  std::ostringstream err_;
  std::vector<Duration> sleeps_;
  testing::TempDir dir_;
};

constexpr std::string_view kValidSpec = "name: t\ncommand: c\nresources:\n  gpus_per_node: 1\n";

std::string job_json(int id, std::string_view state, std::string_view extra = "") {
  return "{\"id\": " + std::to_string(id) + ", \"state\": \"" + std::string(state) + "\"" +
         std::string(extra) + "}";
}

TEST_F(CommandsTest, SubmitSendsTheSpecAndPrintsTheId) {
  std::string path = write_spec(std::string(kValidSpec));
  api_.answer(201, R"({"id": 42})");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitOk);
  EXPECT_EQ(out_.str(), "Submitted job 42\n");
  ASSERT_EQ(api_.calls.size(), 1u);
  EXPECT_EQ(api_.calls[0].method, "POST");
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs");
  EXPECT_EQ(api_.calls[0].body,
            R"({"dry_run":false,"environment":[],"file":"job.yaml","spec":"name: t\ncommand: c\nresources:\n  )"
            R"(gpus_per_node: 1\n"})");
}

// Each submission carries a key of its own (a retry of it sends the same one, so that
// the coordinator makes the job once); a dry run makes nothing and carries none.
TEST_F(CommandsTest, EachSubmitCarriesAFreshIdempotencyKeyAndADryRunNone) {
  std::string path = write_spec(std::string(kValidSpec));
  api_.answer(201, R"({"id": 42})");
  api_.answer(201, R"({"id": 43})");
  api_.answer(200, R"({"dry_run": true, "would_start": true})");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitOk);
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitOk);
  EXPECT_EQ(run_submit(c, {path, true, false}), kExitOk);
  ASSERT_EQ(api_.calls.size(), 3u);
  std::vector<std::string> keys;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(api_.calls[i].headers.size(), 1u);
    EXPECT_EQ(api_.calls[i].headers[0].first, "Idempotency-Key");
    keys.push_back(api_.calls[i].headers[0].second);
    EXPECT_EQ(keys.back().size(), 32u);
    EXPECT_EQ(keys.back().find_first_not_of("0123456789abcdef"), std::string::npos) << keys.back();
  }
  EXPECT_NE(keys[0], keys[1]);
  EXPECT_TRUE(api_.calls[2].headers.empty());
}

TEST_F(CommandsTest, SubmitTakesTheShellsDirectoryAndEnvironmentAsSbatchDoes) {
  std::string path = write_spec(std::string(kValidSpec));
  const model::EnvList environ = {{"VIRTUAL_ENV", "/venv"}, {"CORRAL_TOKEN", "secret"}, {"HF_HOME", "/hf"}};
  for (int i = 0; i < 3; ++i) api_.answer(201, R"({"id": 42})");
  auto c = ctx();
  SubmitOptions all{path, false, false, std::nullopt, "/home/alice/run", environ};
  EXPECT_EQ(run_submit(c, all), kExitOk);
  auto body = nlohmann::json::parse(api_.calls[0].body);
  EXPECT_EQ(body["submit_dir"], "/home/alice/run");
  EXPECT_EQ(body["environment"].dump(), R"([["HF_HOME","/hf"],["VIRTUAL_ENV","/venv"]])");  // never the token
  SubmitOptions some = all;
  some.export_env = "HF_HOME";
  EXPECT_EQ(run_submit(c, some), kExitOk);
  EXPECT_EQ(nlohmann::json::parse(api_.calls[1].body)["environment"].dump(), R"([["HF_HOME","/hf"]])");
  some.export_env = "NONE";
  EXPECT_EQ(run_submit(c, some), kExitOk);
  EXPECT_EQ(nlohmann::json::parse(api_.calls[2].body)["environment"].dump(), "[]");
  some.export_env = "A B";
  EXPECT_EQ(run_submit(c, some), kExitUsage);
  EXPECT_EQ(api_.calls.size(), 3u);  // nothing sent
  EXPECT_TRUE(err_.str().starts_with("corral: --export: must be ALL, NONE or variable names")) << err_.str();
}

TEST_F(CommandsTest, SubmitJsonPrintsTheCoordinatorsAnswer) {
  std::string path = write_spec(std::string(kValidSpec));
  api_.answer(201, R"({"id": 42})");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, false, true}), kExitOk);
  EXPECT_EQ(out_.str(), "{\n  \"id\": 42\n}\n");
}

TEST_F(CommandsTest, SubmitDryRunSaysWhyTheJobWouldWait) {
  std::string path = write_spec(std::string(kValidSpec));
  api_.answer(200,
              R"({"dry_run": true, "would_start": false, "reason": "Resources", "detail": "all GPUs busy"})");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, true, false}), kExitOk);
  EXPECT_EQ(out_.str(),
            "Dry run: the job would wait (nothing was submitted)\n  reason:  Resources\n  detail:  all GPUs "
            "busy\n");
  EXPECT_NE(api_.calls[0].body.find(R"("dry_run":true)"), std::string::npos);
}

TEST_F(CommandsTest, AnInvalidSpecIsRefusedLocallyWithEveryProblem) {
  std::string path = write_spec("name: t\ncommand: c\nresources:\n  gpus_per_node: four\nbogus: 1\n");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitUsage);
  EXPECT_TRUE(api_.calls.empty());
  EXPECT_EQ(out_.str(), "");
  // The messages belong to the spec parser; here only that both are there, located.
  EXPECT_NE(err_.str().find(path + ":4:"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("resources.gpus_per_node"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find(path + ":5:"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, ProblemsTheCoordinatorFindsAreShownWithExit2) {
  std::string path = write_spec(std::string(kValidSpec));
  api_.answer(400, R"({"error": "invalid job spec", "problems": ["job.yaml:3:1: resources: newer rule"]})");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitUsage);
  EXPECT_EQ(err_.str(), "job.yaml:3:1: resources: newer rule\n");
}

TEST_F(CommandsTest, AMissingOrOversizedSpecFileIsBadUsage) {
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {dir_.file("nope.yaml"), false, false}), kExitUsage);
  std::string path = write_spec(std::string(70000, '#'));
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitUsage);
  EXPECT_NE(err_.str().find(path + ": file is 70000 bytes; the limit is 65536"), std::string::npos)
      << err_.str();
  EXPECT_TRUE(api_.calls.empty());
}

TEST_F(CommandsTest, A422IsARequestFailure) {
  std::string path = write_spec(std::string(kValidSpec));
  api_.answer(422, R"({"error": "no node set in the cluster could ever run this job: 1 GPU of class H200"})");
  auto c = ctx();
  EXPECT_EQ(run_submit(c, {path, false, false}), kExitFailed);
  EXPECT_EQ(err_.str(), "corral: no node set in the cluster could ever run this job: 1 GPU of class H200\n");
}

TEST_F(CommandsTest, Unauthenticated401ExitsWith3) {
  api_.answer(401, R"({"error": "unknown token"})");
  auto c = ctx();
  EXPECT_EQ(run_queue(c, {}), kExitUnreachable);
  EXPECT_EQ(err_.str(), "corral: not authenticated: unknown token\n");
}

TEST_F(CommandsTest, Forbidden403SaysNotAllowed) {
  api_.answer(403, R"({"error": "job 7 belongs to bob"})");
  auto c = ctx();
  EXPECT_EQ(run_cancel(c, cancel_jobs({"7"})), kExitFailed);
  EXPECT_EQ(err_.str(), "corral: not allowed: job 7 belongs to bob\n");
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs/7/cancel");
}

TEST_F(CommandsTest, NotFoundAndConflictExitWith1) {
  api_.answer(404, R"({"error": "no job 9"})");
  api_.answer(409, R"({"error": "job 9 already ended COMPLETED"})");
  auto c = ctx();
  EXPECT_EQ(run_show(c, {"9", false}), kExitFailed);
  EXPECT_EQ(run_cancel(c, cancel_jobs({"9"})), kExitFailed);
  EXPECT_EQ(err_.str(), "corral: no job 9\ncorral: job 9 already ended COMPLETED\n");
}

TEST_F(CommandsTest, AnUnreachableCoordinatorExitsWith3) {
  api_.fail(ErrorCode::Unavailable, "cannot connect to 127.0.0.1:1: Connection refused");
  auto c = ctx();
  EXPECT_EQ(run_nodes(c, false, false), kExitUnreachable);
  EXPECT_EQ(err_.str(), "corral: cannot connect to 127.0.0.1:1: Connection refused\n");
}

TEST_F(CommandsTest, QueueAsksForAllJobsOfAUser) {
  api_.answer(200, "[]");
  auto c = ctx();
  EXPECT_EQ(run_queue(c, queue_of({"a b"}, true)), kExitOk);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs?all=1&user=a%20b");
  EXPECT_EQ(out_.str(), "ID  NAME  USER  STATE  REASON  NODES  GPUS  TIME  TIME_LIMIT\n");
}

TEST_F(CommandsTest, QueueJsonIsTheList) {
  api_.answer(200, R"([{"id":1,"state":"PENDING"}])");
  auto c = ctx();
  EXPECT_EQ(run_queue(c, queue_json()), kExitOk);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs");
  EXPECT_EQ(out_.str(), "[\n  {\n    \"id\": 1,\n    \"state\": \"PENDING\"\n  }\n]\n");
}

TEST_F(CommandsTest, AnAnswerThatIsNotJsonIsAFailure) {
  api_.answer(200, "<html>");
  auto c = ctx();
  EXPECT_EQ(run_queue(c, {}), kExitFailed);
  EXPECT_EQ(err_.str(), "corral: unexpected answer from the coordinator: malformed JSON\n");
}

TEST_F(CommandsTest, WaitHoldsEachRequestAndPausesOnlyAfterEarlyAnswers) {
  api_.answer(200, job_json(5, "PENDING"));
  api_.answer(200, job_json(5, "RUNNING"));
  api_.answer(200, job_json(5, "COMPLETED", R"(, "exit_code": 0)"));
  auto c = ctx();
  EXPECT_EQ(run_wait(c, {.job = "5"}), kExitOk);
  EXPECT_EQ(out_.str(), "Job 5 COMPLETED\n");
  EXPECT_EQ(sleeps_, (std::vector<Duration>{200ms, 200ms}));
  EXPECT_EQ(api_.calls.size(), 3u);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs/5?wait=20");
}

TEST_F(CommandsTest, WaitDoesNotPauseAfterARequestHeldItsFullTime) {
  api_.answer(200, job_json(5, "RUNNING"));
  api_.answer(200, job_json(5, "COMPLETED"));
  // The fake API answers at once; a clock moved by the call stands for a held request.
  struct HeldApi : ApiClient {
    FakeApi& inner;
    FakeClock& clock;
    HeldApi(FakeApi& a, FakeClock& c) : inner(a), clock(c) {}
    Result<ApiResponse> call(const std::string& m, const std::string& t, const std::string& b,
                             const ApiHeaders& h) override {
      clock.advance(20s);
      return inner.call(m, t, b, h);
    }
  } held(api_, clock_);
  CommandContext c{held, out_, err_, clock_, [this](Duration d) { sleeps_.push_back(d); }};
  EXPECT_EQ(run_wait(c, {.job = "5"}), kExitOk);
  EXPECT_TRUE(sleeps_.empty());
  EXPECT_EQ(api_.calls.size(), 2u);
}

TEST_F(CommandsTest, WaitExitsWithTheJobsOwnCodeOrOneNamingHowItEnded) {
  // As srun: a failed job's exit code; TIMEOUT and CANCELLED their own; anything else 1.
  const std::vector<std::tuple<std::string_view, std::string, int>> cases = {
      {"FAILED", R"(, "reason": "X", "exit_code": 7)", 7},
      {"FAILED", R"(, "reason": "X", "exit_code": 0)", kExitFailed},  // no rank code to pass on
      {"FAILED", R"(, "reason": "X")", kExitFailed},
      {"CANCELLED", R"(, "reason": "X")", kExitJobCancelled},
      {"TIMEOUT", R"(, "reason": "X")", kExitJobTimeout},
      {"NODE_FAIL", R"(, "reason": "X", "exit_code": 9)", kExitFailed},
  };
  for (const auto& [state, extra, code] : cases) {
    api_.answer(200, job_json(5, state, extra));
    auto c = ctx();
    EXPECT_EQ(run_wait(c, {.job = "5"}), code) << state << extra;
  }
  EXPECT_NE(kExitJobTimeout, kExitJobCancelled);
}

TEST_F(CommandsTest, WaitGivesUpAtItsTimeout) {
  for (int i = 0; i < 10; ++i) api_.answer(200, job_json(5, "RUNNING"));
  auto c = ctx();
  EXPECT_EQ(run_wait(c, {.job = "5", .timeout = 500ms}), kExitFailed);
  EXPECT_EQ(sleeps_, (std::vector<Duration>{200ms, 200ms, 100ms}));
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs/5?wait=1");  // never held past the timeout
  EXPECT_EQ(err_.str(), "corral: timed out after 0:00 waiting for job 5 (still RUNNING)\n");
}

TEST_F(CommandsTest, WaitRidesOutACoordinatorRestart) {
  api_.answer(200, job_json(5, "RUNNING"));
  api_.fail(ErrorCode::Unavailable, "cannot connect: refused");
  api_.fail(ErrorCode::Unavailable, "cannot connect: refused");
  api_.answer(200, job_json(5, "COMPLETED"));
  auto c = ctx();
  EXPECT_EQ(run_wait(c, {.job = "5"}), kExitOk);
  EXPECT_EQ(err_.str(), "corral: cannot connect: refused; still waiting\n");
}

TEST_F(CommandsTest, WaitFailsAtOnceWhenTheCoordinatorWasNeverReached) {
  api_.fail(ErrorCode::Unavailable, "cannot connect: refused");
  auto c = ctx();
  EXPECT_EQ(run_wait(c, {.job = "5"}), kExitUnreachable);
}

TEST_F(CommandsTest, LogsFollowReadsFromEachNewOffsetUntilFinishedAndDrained) {
  api_.answer(200, job_json(3, "RUNNING", R"(, "ranks": [{"rank": 0, "node": "a", "state": "RUNNING"}])"));
  api_.answer(200, R"({"rank": 1, "node": "a", "offset": 0, "data": "one\n", "size": 4, "finished": false})");
  api_.answer(200, R"({"rank": 1, "node": "a", "offset": 4, "data": "", "size": 4, "finished": false})");
  api_.answer(200, R"({"rank": 1, "node": "a", "offset": 4, "data": "two\n", "size": 8, "finished": false})");
  api_.answer(200, R"({"rank": 1, "node": "a", "offset": 8, "data": "", "size": 8, "finished": true})");
  auto c = ctx();
  EXPECT_EQ(run_logs(c, {.job = "3", .rank = 1, .follow = true}), kExitOk);
  EXPECT_EQ(out_.str(), "one\ntwo\n");
  ASSERT_EQ(api_.calls.size(), 5u);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs/3");
  EXPECT_EQ(api_.calls[1].target, "/v1/jobs/3/logs?rank=1&offset=0");
  EXPECT_EQ(api_.calls[2].target, "/v1/jobs/3/logs?rank=1&offset=4");
  EXPECT_EQ(api_.calls[4].target, "/v1/jobs/3/logs?rank=1&offset=8");
  EXPECT_EQ(sleeps_, (std::vector<Duration>{250ms}));  // only after an empty answer
}

TEST_F(CommandsTest, LogsFollowOnAPendingJobWaitsForItToStart) {
  api_.answer(200, job_json(3, "PENDING", R"(, "reason": "Resources")"));
  api_.answer(200, job_json(3, "PENDING", R"(, "reason": "Resources")"));
  api_.answer(200, job_json(3, "STARTING", R"(, "ranks": [{"rank": 0, "node": "a", "state": "PENDING"}])"));
  api_.answer(200, R"({"rank": 0, "node": "a", "offset": 0, "data": "hi\n", "size": 3, "finished": true})");
  auto c = ctx();
  EXPECT_EQ(run_logs(c, {.job = "3", .follow = true}), kExitOk);
  EXPECT_EQ(out_.str(), "hi\n");
  EXPECT_EQ(err_.str(), "corral: job 3 is PENDING (Resources); waiting for it to start\n");  // said once
  EXPECT_EQ(sleeps_, (std::vector<Duration>{500ms, 500ms}));
}

TEST_F(CommandsTest, LogsFollowOnAJobCancelledBeforeItStartedSaysSoAndExits125) {
  api_.answer(200, job_json(3, "PENDING"));
  api_.answer(200, job_json(3, "CANCELLED", R"(, "reason": "Cancelled")"));
  auto c = ctx();
  EXPECT_EQ(run_logs(c, {.job = "3", .follow = true}), kExitJobCancelled);
  EXPECT_NE(err_.str().find("CANCELLED"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("without starting"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, QueueFiltersByUsersStatesAndMe) {
  api_.answer(200, "[]");
  auto c = ctx();
  EXPECT_EQ(run_queue(c, {.users = {"alice", "bob"}, .states = {"PD", "RUNNING"}, .me = true}), kExitOk);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs?user=alice%2Cbob&state=PD%2CRUNNING&me=1");
}

TEST_F(CommandsTest, CancelOfSeveralJobsIsOneRequestAndNamesEachRefusal) {
  api_.answer(200, R"({"cancelled": [{"id": 4, "state": "CANCELLED"}, {"id": 6, "state": "ENDING"}],
                       "failed": [{"id": 5, "status": 403, "error": "job 5 belongs to bob"}]})");
  auto c = ctx();
  EXPECT_EQ(run_cancel(c, cancel_jobs({"4", "5", "6"})), kExitFailed);
  ASSERT_EQ(api_.calls.size(), 1u);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs/cancel");
  EXPECT_EQ(nlohmann::json::parse(api_.calls[0].body), nlohmann::json::parse(R"({"ids": [4, 5, 6]})"));
  EXPECT_EQ(out_.str(), "Cancelled job 4\nCancelled job 6 (state ENDING)\n");
  EXPECT_EQ(err_.str(), "corral: job 5 belongs to bob\n");
}

TEST_F(CommandsTest, CancelByUserAndStateSendsTheFilter) {
  api_.answer(200, R"({"cancelled": [], "failed": []})");
  auto c = ctx();
  EXPECT_EQ(run_cancel(c, cancel_by({"alice"}, {"PENDING"})), kExitOk);
  EXPECT_EQ(nlohmann::json::parse(api_.calls[0].body),
            nlohmann::json::parse(R"({"user": ["alice"], "state": ["PENDING"]})"));
  EXPECT_EQ(out_.str(), "No job matched\n");
}

TEST_F(CommandsTest, SubmitDashReadsTheSpecFromStandardInputAndParsablePrintsTheIdAlone) {
  std::istringstream in{std::string(kValidSpec)};
  api_.answer(201, R"({"id": 77})");
  auto c = ctx();
  SubmitOptions o{"-"};
  o.in = &in;
  o.parsable = true;
  EXPECT_EQ(run_submit(c, o), kExitOk);
  EXPECT_EQ(out_.str(), "77\n");
  auto body = nlohmann::json::parse(api_.calls[0].body);
  EXPECT_EQ(body["spec"], std::string(kValidSpec));
  EXPECT_EQ(body["file"], "stdin");
}

TEST_F(CommandsTest, AnInvalidSpecOnStandardInputIsNamedStdin) {
  std::istringstream in("name: t\ncommand: c\n");
  auto c = ctx();
  SubmitOptions o{"-"};
  o.in = &in;
  EXPECT_EQ(run_submit(c, o), kExitUsage);
  EXPECT_EQ(err_.str().rfind("stdin:", 0), 0u) << err_.str();
  EXPECT_TRUE(api_.calls.empty());
}

TEST_F(CommandsTest, ExportSlurmWritesTheShapeLimitsAndARankWrapperQuotingEveryArgument) {
  std::string path = write_spec(
      "name: sweep\ncommand: [python3, \"it's.py\", --lr, \"3e-4\"]\nworkdir: /data/run\nenv: {A: \"x y\"}\n"
      "resources: {gpus: 8, gpu: {model: \"NVIDIA A100*\"}}\nlaunch: {gpu_visibility: rank}\ntime_limit: 90m\n"
      "array: \"0-3%2\"\nretries: 1\n");
  auto c = ctx();
  EXPECT_EQ(run_export(c, SubmitOptions{path}), kExitOk) << err_.str();
  const std::string script = out_.str();
  for (const char* line : {"#!/bin/bash\n", "#SBATCH --job-name=sweep\n", "#SBATCH --nodes=1\n",
                           "#SBATCH --ntasks-per-node=8\n", "#SBATCH --gres=gpu:8\n", "#SBATCH --time=0-01:30:00\n",
                           "#SBATCH --chdir=/data/run\n", "#SBATCH --array=0-3%2\n", "export A='x y'\n",
                           "# resources.gpu (model, memory, CUDA) has no portable Slurm form",
                           "# retries: 1 in corral; Slurm's nearest is --requeue.\n",
                           "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))\n",
                           "corral-rank 'python3' 'it'\\''s.py' '--lr' '3e-4'\n"}) {
    EXPECT_NE(script.find(line), std::string::npos) << line << "\n" << script;
  }
  EXPECT_NE(script.find("CUDA_VISIBLE_DEVICES=$(IFS=,"), std::string::npos);  // gpu_visibility: rank
  EXPECT_TRUE(api_.calls.empty());  // nothing sent
}

TEST_F(CommandsTest, LogsWithoutFollowPrintsWhatIsThereAndStops) {
  api_.answer(200, R"({"rank": 0, "node": "a", "offset": 0, "data": "abc", "size": 5, "finished": false})");
  api_.answer(200, R"({"rank": 0, "node": "a", "offset": 3, "data": "de", "size": 9, "finished": false})");
  auto c = ctx();
  EXPECT_EQ(run_logs(c, {.job = "3"}), kExitOk);
  EXPECT_EQ(out_.str(), "abcde");
  EXPECT_EQ(api_.calls.size(), 2u);
  EXPECT_TRUE(sleeps_.empty());
}

TEST_F(CommandsTest, LogsSaysAfterTheLogThatItWasCutAndMayHaveLostOutput) {
  api_.answer(200, R"({"rank": 0, "node": "a", "offset": 0, "data": "head\n[corral: 900 bytes cut from this log]\n",
                       "size": 1000, "finished": true, "cut": 900})");
  api_.answer(200, R"({"rank": 0, "node": "a", "offset": 995, "data": "tail\n", "size": 1000, "finished": true,
                       "cut": 900, "lost": "the spool was full"})");
  auto c = ctx();
  EXPECT_EQ(run_logs(c, {.job = "3"}), kExitOk);
  EXPECT_EQ(out_.str(), "head\n[corral: 900 bytes cut from this log]\ntail\n");
  ASSERT_EQ(api_.calls.size(), 2u);  // the second answer starts after the hole (995)
  EXPECT_EQ(api_.calls[1].target, "/v1/jobs/3/logs?rank=0&offset=43");
  EXPECT_EQ(err_.str(),
            "corral: 900 bytes were cut from the middle of this log (the node's rank_log_cap); a line "
            "\"[corral: N bytes cut from this log]\" marks where\n"
            "corral: output may be missing from this log: the spool was full\n");
}

TEST_F(CommandsTest, DrainSendsTheReasonAndResumeNothing) {
  api_.answer(200, R"({"name": "gpu a", "state": "drained", "reason": "bad fan"})");
  api_.answer(200, R"({"name": "gpu a", "state": "up", "reason": ""})");
  auto c = ctx();
  EXPECT_EQ(run_drain(c, {"gpu a", "bad fan", false}), kExitOk);
  EXPECT_EQ(run_resume(c, {"gpu a", "", false}), kExitOk);
  EXPECT_EQ(api_.calls[0].target, "/v1/nodes/gpu%20a/drain");
  EXPECT_EQ(api_.calls[0].body, R"({"reason":"bad fan"})");
  EXPECT_EQ(api_.calls[1].target, "/v1/nodes/gpu%20a/resume");
  EXPECT_EQ(out_.str(), "Node gpu a is drained (bad fan)\nNode gpu a is up\n");
}

// run_app: the argument parsing in front of the commands.
class AppTest : public CommandsTest {
 protected:
  int run(std::vector<std::string> args) {
    AppContext app{out_,
                   err_,
                   [](const std::string&) { return std::nullopt; },
                   clock_,
                   [](Duration) {},
                   [this](HttpApiClient::SettingsSource source) -> std::unique_ptr<ApiClient> {
                     settings_ = std::move(source);
                     return std::make_unique<Forward>(api_);
                   }};
    return run_app(args, app);
  }
  // Hands calls to the fixture's FakeApi, which run_app cannot own.
  struct Forward : ApiClient {
    explicit Forward(FakeApi& api) : api_(api) {}
    Result<ApiResponse> call(const std::string& m, const std::string& t, const std::string& b,
                             const ApiHeaders& h) override {
      return api_.call(m, t, b, h);
    }
    FakeApi& api_;
  };
  HttpApiClient::SettingsSource settings_;
};

TEST_F(AppTest, ParseErrorsAreExit2AndHelpIsExit0) {
  EXPECT_EQ(run({}), kExitUsage);
  EXPECT_EQ(run({"frobnicate"}), kExitUsage);
  EXPECT_EQ(run({"show"}), kExitUsage);
  EXPECT_EQ(run({"show", "abc"}), kExitUsage);
  EXPECT_EQ(run({"show", "0"}), kExitUsage);
  EXPECT_EQ(run({"logs", "1", "--rank", "-1"}), kExitUsage);
  EXPECT_EQ(run({"wait", "1", "--timeout", "soon"}), kExitUsage);
  EXPECT_EQ(run({"drain", "gpu-a"}), kExitUsage);
  EXPECT_EQ(run({"drain", "gpu-a", "--reason", ""}), kExitUsage);
  EXPECT_EQ(run({"cancel"}), kExitUsage);
  EXPECT_EQ(run({"cancel", "3", "--user", "bob"}), kExitUsage);
  EXPECT_EQ(run({"cancel", "3", "x"}), kExitUsage);
  EXPECT_TRUE(api_.calls.empty());
  EXPECT_EQ(run({"--help"}), kExitOk);
  EXPECT_NE(out_.str().find("submit"), std::string::npos);
}

TEST_F(AppTest, VersionIsExit0AndNamesTheProgram) {
  EXPECT_EQ(run({"--version"}), kExitOk);
  EXPECT_EQ(out_.str().rfind("corral 0.", 0), 0u) << out_.str();
}

TEST_F(AppTest, CommaListsAndRepeatedFlagsBothWork) {
  api_.answer(200, "[]");
  EXPECT_EQ(run({"queue", "--user", "a,b", "-u", "c", "--state", "pd"}), kExitOk);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs?user=a%2Cb%2Cc&state=pd");
  api_.answer(200, R"({"cancelled": [{"id": 1, "state": "CANCELLED"}, {"id": 2, "state": "CANCELLED"}], "failed": []})");
  EXPECT_EQ(run({"cancel", "1", "2"}), kExitOk);
  EXPECT_EQ(api_.calls[1].target, "/v1/jobs/cancel");
}

TEST_F(AppTest, DispatchesToTheCommand) {
  api_.answer(200, "[]");
  EXPECT_EQ(run({"queue", "--all", "--user", "bob"}), kExitOk);
  EXPECT_EQ(api_.calls[0].target, "/v1/jobs?all=1&user=bob");
  api_.answer(200, job_json(4, "COMPLETED"));
  EXPECT_EQ(run({"wait", "4", "--timeout", "1m"}), kExitOk);
}

TEST_F(AppTest, TheConfigFlagMayFollowTheCommand) {
  api_.answer(200, "[]");
  EXPECT_EQ(run({"queue", "--config", dir_.file("none.yaml")}), kExitOk);
  ASSERT_TRUE(settings_);
  auto s = settings_();
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find(dir_.file("none.yaml")), std::string::npos);
}

TEST(ParseTimeout, SecondsOrADuration) {
  EXPECT_EQ(parse_timeout("30"), Duration(30s));
  EXPECT_EQ(parse_timeout("2.5"), Duration(2500ms));
  EXPECT_EQ(parse_timeout("1h30m"), Duration(90min));
  EXPECT_FALSE(parse_timeout("-1").has_value());
  EXPECT_FALSE(parse_timeout("").has_value());
}

TEST(ExitCodes, FollowTheDocumentedClasses) {
  EXPECT_EQ(exit_code_for(Error(ErrorCode::Unavailable, "")), kExitUnreachable);
  EXPECT_EQ(exit_code_for(Error(ErrorCode::Timeout, "")), kExitUnreachable);
  EXPECT_EQ(exit_code_for(Error(ErrorCode::Unauthenticated, "")), kExitUnreachable);
  EXPECT_EQ(exit_code_for(Error(ErrorCode::InvalidArgument, "")), kExitUsage);
  EXPECT_EQ(exit_code_for(error_from_response({503, R"({"error": "agent of gpu-a not connected"})"})),
            kExitFailed);
  EXPECT_EQ(exit_code_for(error_from_response({400, R"({"error": "bad"})"})), kExitUsage);
  EXPECT_EQ(error_from_response({500, "oops"}).message(), "the coordinator answered HTTP 500");
}

}  // namespace
}  // namespace corral::cli
