// What `corral` prints for people, from JSON answers shaped like the coordinator's
// (docs/api.md): exact text, because these tables are the interface people read.

#include "cli/format.hpp"

#include <gtest/gtest.h>

#include <regex>

#include "cli/views.hpp"

namespace corral::cli {
namespace {

using namespace std::chrono_literals;

TimePoint at(std::string_view rfc3339) {
  auto t = parse_rfc3339(rfc3339);
  EXPECT_TRUE(t.has_value()) << rfc3339;
  return t.value_or(TimePoint{});
}

const TimePoint kNow = at("2026-12-02T12:00:00.000Z");

constexpr std::string_view kQueueJson = R"([
  {"id": 41, "name": "resnet50-ddp", "user": "alice", "state": "RUNNING", "reason": "", "detail": "",
   "attempt": 0, "retries": 0, "priority": 0, "nodes": 2, "gpus": 4, "time_limit": 7200,
   "submitted_at": "2026-12-02T10:57:00.000Z", "started_at": "2026-12-02T10:57:57.000Z", "ended_at": null,
   "master_addr": "10.0.0.11", "master_port": 29500, "node_list": ["gpu-a", "gpu-b"],
   "failed_rank": null, "failed_node": "", "exit_code": null, "ranks": []},
  {"id": 42, "name": "sweep-7", "user": "bob", "state": "PENDING", "reason": "Resources",
   "detail": "no free set of 8 GPUs", "attempt": 0, "retries": 0, "priority": 0, "nodes": 1, "gpus": 8,
   "time_limit": null, "submitted_at": "2026-12-02T11:00:00.000Z", "started_at": null, "ended_at": null,
   "master_addr": null, "master_port": null, "node_list": [], "failed_rank": null, "failed_node": "",
   "exit_code": null, "ranks": []},
  {"id": 40, "name": "eval", "user": "carol", "state": "FAILED", "reason": "RankFailed", "detail": "",
   "attempt": 0, "retries": 0, "priority": 0, "nodes": 1, "gpus": 1, "time_limit": 360000,
   "submitted_at": "2026-11-30T07:59:00.000Z", "started_at": "2026-11-30T08:00:00.000Z",
   "ended_at": "2026-12-02T11:04:05.500Z", "master_addr": "10.0.0.13", "master_port": 29501,
   "failed_rank": 0, "failed_node": "gpu-c", "exit_code": 1,
   "ranks": [{"rank": 0, "node": "gpu-c", "local_rank": 0, "gpus": [3], "gpu_uuids": ["GPU-c3"],
              "pid": 77, "state": "EXITED", "exit_code": 1, "signal": null}]}
])";

constexpr std::string_view kJobJson = R"({
  "id": 43, "name": "ddp", "user": "alice", "state": "FAILED", "reason": "RankFailed", "detail": "",
  "attempt": 1, "retries": 1, "priority": 5, "nodes": 2, "gpus": 2, "time_limit": 3600,
  "submitted_at": "2026-12-02T10:00:00.123Z", "started_at": "2026-12-02T10:00:01.000Z",
  "ended_at": "2026-12-02T10:01:03.000Z", "master_addr": "10.0.0.11", "master_port": 29500,
  "node_list": ["gpu-a", "gpu-b"], "failed_rank": 1, "failed_node": "gpu-b", "exit_code": 3,
  "ranks": [
    {"rank": 0, "node": "gpu-a", "local_rank": 0, "gpus": [0], "gpu_uuids": ["GPU-aaaa"], "pid": 4242,
     "state": "KILLED", "exit_code": null, "signal": 15},
    {"rank": 1, "node": "gpu-b", "local_rank": 0, "gpus": [2], "gpu_uuids": ["GPU-bbbb"], "pid": 5151,
     "state": "EXITED", "exit_code": 3, "signal": null}],
  "events": [
    {"at": "2026-12-02T10:00:00.123Z", "text": "submitted by alice"},
    {"at": "2026-12-02T10:00:01.000Z", "text": "PENDING -> STARTING on gpu-a[0],gpu-b[2] master 10.0.0.11:29500"},
    {"at": "2026-12-02T10:01:03.000Z", "text": "RUNNING -> FAILED: rank 1 on gpu-b exited 3"}]
})";

constexpr std::string_view kNodesJson = R"([
  {"name": "gpu-a", "address": "10.0.0.11", "state": "up", "reason": "", "simulated": true, "connected": true,
   "last_seen": "2026-12-02T11:59:59.500Z", "driver": "550.54.15", "cuda": "12.4", "ports": [29500, 29999],
   "gpus": [
     {"index": 0, "uuid": "GPU-sim-0", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
      "driver": "550.54.15", "cuda": "12.4", "nvlink_peers": [1], "job": 42},
     {"index": 1, "uuid": "GPU-sim-1", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
      "driver": "550.54.15", "cuda": "12.4", "nvlink_peers": [0], "job": null}]},
  {"name": "gpu-b", "address": "10.0.0.12", "state": "drained", "reason": "preflight: GPU 1 not visible",
   "simulated": false, "connected": true, "last_seen": "2026-12-02T11:59:59.000Z", "driver": "535.104.05",
   "cuda": "12.2", "ports": [29500, 29999],
   "gpus": [{"index": 0, "uuid": "GPU-b0", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
             "driver": "535.104.05", "cuda": "12.2", "nvlink_peers": [], "job": null}]},
  {"name": "gpu-c", "address": "10.0.0.13", "state": "down", "reason": "no heartbeat for 12s", "simulated": false,
   "connected": false, "last_seen": null, "driver": "", "cuda": "", "ports": [29500, 29999], "gpus": []}
])";

TEST(FormatElapsed, UsesSlurmsShapes) {
  EXPECT_EQ(format_elapsed(0s), "0:00");
  EXPECT_EQ(format_elapsed(999ms), "0:00");
  EXPECT_EQ(format_elapsed(59s), "0:59");
  EXPECT_EQ(format_elapsed(65s), "1:05");
  EXPECT_EQ(format_elapsed(59min + 59s), "59:59");
  EXPECT_EQ(format_elapsed(1h + 2min + 3s), "1:02:03");
  EXPECT_EQ(format_elapsed(23h + 59min + 59s), "23:59:59");
  EXPECT_EQ(format_elapsed(24h), "1-00:00:00");
  EXPECT_EQ(format_elapsed(2 * 24h + 3h + 4min + 5s), "2-03:04:05");
  EXPECT_EQ(format_elapsed(400 * 24h), "400-00:00:00");
}

TEST(FormatElapsed, NegativeDurationsPrintAsZero) {
  EXPECT_EQ(format_elapsed(-5s), "0:00");
}

TEST(FormatTimeLimit, NoLimitIsUnlimited) {
  EXPECT_EQ(format_time_limit(std::nullopt), "UNLIMITED");
  EXPECT_EQ(format_time_limit(7200.0), "2:00:00");
  EXPECT_EQ(format_time_limit(90.5), "1:30");
}

TEST(ParseRfc3339, ReadsTheCoordinatorsTimes) {
  auto t = parse_rfc3339("2026-12-02T10:00:00.123Z");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(*t - at("2026-12-02T10:00:00Z"), 123ms);
  EXPECT_EQ(at("2026-12-02T12:00:00+02:00"), at("2026-12-02T10:00:00Z"));
  EXPECT_EQ(at("1970-01-01T00:00:01.5Z"), from_millis(1500));
}

TEST(ParseRfc3339, RefusesWhatIsNotATime) {
  for (std::string_view bad : {"", "yesterday", "2026-13-02T10:00:00Z", "2026-12-02T10:00:00",
                               "2026-12-02T10:00:00.Z", "2026-12-02T25:00:00Z", "2026-12-02T10:00:00Zjunk"}) {
    EXPECT_FALSE(parse_rfc3339(bad).has_value()) << bad;
  }
}

TEST(FormatQueue, PrintsAnAlignedTableLikeSqueue) {
  auto jobs = parse_jobs(kQueueJson);
  ASSERT_TRUE(jobs.has_value()) << jobs.error().message();
  EXPECT_EQ(format_queue(*jobs, kNow),
            "ID  NAME          USER   STATE    REASON      NODES        GPUS  TIME        TIME_LIMIT\n"
            "41  resnet50-ddp  alice  RUNNING  -           gpu-a,gpu-b  4     1:02:03     2:00:00\n"
            "42  sweep-7       bob    PENDING  Resources   1            8     0:00        UNLIMITED\n"
            "40  eval          carol  FAILED   RankFailed  gpu-c        1     2-03:04:05  4-04:00:00\n");
}

TEST(FormatQueue, AnEmptyQueueIsJustTheHeader) {
  auto jobs = parse_jobs("[]");
  ASSERT_TRUE(jobs.has_value());
  EXPECT_EQ(format_queue(*jobs, kNow), "ID  NAME  USER  STATE  REASON  NODES  GPUS  TIME  TIME_LIMIT\n");
}

TEST(FormatQueue, ControlCharactersFromTheCoordinatorAreNotPrinted) {
  auto jobs =
      parse_jobs(R"([{"id": 1, "name": "x\u001b]0;pwned\u0007y", "user": "a\u0085b", "state": "PENDING",
                              "nodes": 1, "gpus": 1}])");
  ASSERT_TRUE(jobs.has_value()) << jobs.error().message();
  EXPECT_EQ(format_queue(*jobs, kNow),
            "ID  NAME          USER  STATE    REASON  NODES  GPUS  TIME  TIME_LIMIT\n"
            "1   x?]0;pwned?y  a?b   PENDING  -       1      1     0:00  UNLIMITED\n");
}

TEST(FormatJob, ShowsEveryFieldTheRanksAndTheEventLog) {
  auto job = parse_job(kJobJson);
  ASSERT_TRUE(job.has_value()) << job.error().message();
  EXPECT_EQ(format_job(*job, kNow),
            "ID:           43\n"
            "Name:         ddp\n"
            "User:         alice\n"
            "State:        FAILED\n"
            "Reason:       RankFailed\n"
            "Attempt:      1\n"
            "Retries:      1\n"
            "Priority:     5\n"
            "Nodes:        2 (gpu-a,gpu-b)\n"
            "GPUs:         2\n"
            "Time limit:   1:00:00\n"
            "Submitted:    2026-12-02T10:00:00.123Z\n"
            "Started:      2026-12-02T10:00:01.000Z\n"
            "Ended:        2026-12-02T10:01:03.000Z\n"
            "Run time:     1:02\n"
            "Master:       10.0.0.11:29500\n"
            "Failed rank:  1 on gpu-b\n"
            "Exit code:    3\n"
            "\n"
            "RANK  NODE   LOCAL  GPUS  UUIDS     PID   STATE   EXIT\n"
            "0     gpu-a  0      0     GPU-aaaa  4242  KILLED  SIGTERM\n"
            "1     gpu-b  0      2     GPU-bbbb  5151  EXITED  3\n"
            "\n"
            "Events:\n"
            "  2026-12-02T10:00:00.123Z  submitted by alice\n"
            "  2026-12-02T10:00:01.000Z  PENDING -> STARTING on gpu-a[0],gpu-b[2] master 10.0.0.11:29500\n"
            "  2026-12-02T10:01:03.000Z  RUNNING -> FAILED: rank 1 on gpu-b exited 3\n");
}

TEST(FormatJob, TheRendezvousWhileItLastsAndNotForAJobThatEndedBeforeAnyLook) {
  std::string text(kJobJson);
  auto at = text.find("\"exit_code\": 3,\n");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"rendezvous\": {\"ranks\": 2, \"joined\": 0, \"complete_after_ms\": null, "
                  "\"waiting_for\": [{\"rank\": 1, \"node\": \"gpu-b\"}], \"timeout_s\": 300}, ");
  auto ended = parse_job(text);
  ASSERT_TRUE(ended.has_value()) << ended.error().message();
  std::string out = format_job(*ended, kNow);
  EXPECT_EQ(out.find("Rendezvous"), std::string::npos) << out;
  EXPECT_EQ(out.find("JOINED"), std::string::npos) << out;
  auto running = parse_job(std::regex_replace(text, std::regex("\"state\": \"FAILED\""), "\"state\": \"RUNNING\""));
  ASSERT_TRUE(running.has_value());
  out = format_job(*running, kNow);
  EXPECT_NE(out.find("waiting for ranks 1 (gpu-b), 0 of 2 joined; deadline 5m after the start"), std::string::npos)
      << out;
  EXPECT_NE(out.find("JOINED"), std::string::npos) << out;
  // Ended with one check-in seen: said as what the looks saw, not as a rendezvous that
  // stopped halfway (a job of milliseconds ends between two looks).
  auto one = parse_job(std::regex_replace(text, std::regex("\"joined\": 0"), "\"joined\": 1"));
  ASSERT_TRUE(one.has_value());
  out = format_job(*one, kNow);
  EXPECT_NE(out.find("Rendezvous:   1 of 2 ranks seen checking in before the job ended (the agents look every 200 ms)\n"),
            std::string::npos)
      << out;
}

TEST(FormatJob, AnEndingJobSaysItsOutcomeAndTheRanksItWaitsFor) {
  std::string text(kJobJson);
  auto change = [&](const std::string& from, const std::string& to) {
    auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  change("\"state\": \"FAILED\"", "\"state\": \"ENDING\"");
  change("\"exit_code\": 3,\n", "\"exit_code\": 3, \"outcome\": \"FAILED\",\n");
  change("\"signal\": 15}", "\"signal\": 15, \"gone\": true}");
  change("\"state\": \"EXITED\"", "\"state\": \"RUNNING\"");
  auto job = parse_job(text);
  ASSERT_TRUE(job.has_value()) << job.error().message();
  std::string out = format_job(*job, kNow);
  EXPECT_NE(out.find("State:        ENDING (FAILED once every rank is gone)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("Waiting for:  ranks 1 on gpu-b (running) to be confirmed gone\n"), std::string::npos) << out;
}

TEST(FormatJob, FencesOfALostNodeAreShown) {
  std::string text(kJobJson);
  auto at = text.find("\"exit_code\": 3,\n");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"fences\": [{\"attempt\": 0, \"node\": \"gpu-b\", \"gpus\": [2, 3], \"host\": \"10.0.0.1\", \"port\": 29500}], ");
  auto job = parse_job(text);
  ASSERT_TRUE(job.has_value()) << job.error().message();
  std::string out = format_job(*job, kNow);
  EXPECT_NE(out.find("Fenced:       gpu-b: GPUs 2,3 and port 10.0.0.1:29500 (attempt 0): not confirmed dead\n"), std::string::npos)
      << out;
}

TEST(FormatJob, APendingJobSaysWhyAndThatNoRankStarted) {
  auto job =
      parse_job(R"({"id": 7, "name": "big", "user": "bob", "state": "PENDING", "reason": "NoHomogeneousSet",
                           "detail": "largest free set is 4 x A100 on gpu-b", "nodes": 2, "gpus": 16,
                           "time_limit": null, "submitted_at": "2026-12-02T11:00:00.000Z", "started_at": null,
                           "ended_at": null, "master_addr": null, "master_port": null, "ranks": [],
                           "events": [{"at": "2026-12-02T11:00:00.000Z", "text": "submitted by bob"}]})");
  ASSERT_TRUE(job.has_value()) << job.error().message();
  EXPECT_EQ(format_job(*job, kNow),
            "ID:          7\n"
            "Name:        big\n"
            "User:        bob\n"
            "State:       PENDING\n"
            "Reason:      NoHomogeneousSet\n"
            "Detail:      largest free set is 4 x A100 on gpu-b\n"
            "Attempt:     0\n"
            "Retries:     0\n"
            "Priority:    0\n"
            "Nodes:       2\n"
            "GPUs:        16\n"
            "Time limit:  UNLIMITED\n"
            "Submitted:   2026-12-02T11:00:00.000Z\n"
            "Started:     -\n"
            "Ended:       -\n"
            "Master:      -\n"
            "\n"
            "Ranks: none started\n"
            "\n"
            "Events:\n"
            "  2026-12-02T11:00:00.000Z  submitted by bob\n");
}

TEST(FormatJob, RunTimeOfARunningJobCountsToNow) {
  auto job = parse_job(R"({"id": 8, "state": "RUNNING", "started_at": "2026-12-02T11:30:00.000Z"})");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job_run_time(*job, kNow), 30min);
}

TEST(JobInfo, NodeNamesComeFromTheRanksWhenTheListIsAbsent) {
  auto job = parse_job(R"({"id": 9, "state": "RUNNING", "ranks": [
      {"rank": 2, "node": "gpu-b"}, {"rank": 0, "node": "gpu-a"}, {"rank": 1, "node": "gpu-a"}]})");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->node_names(), (std::vector<std::string>{"gpu-a", "gpu-b"}));
}

TEST(FormatNodes, ANodeLineThenItsGpusAndSimulatedNodesAreLabelled) {
  auto nodes = parse_nodes(kNodesJson);
  ASSERT_TRUE(nodes.has_value()) << nodes.error().message();
  EXPECT_EQ(format_nodes(*nodes),
            "NAME   STATE    REASON                        ADDRESS    GPUS  SIMULATED\n"
            "gpu-a  up       -                             10.0.0.11  2     yes\n"
            "    GPU  PRODUCT                MEMORY     DRIVER      CUDA  JOB\n"
            "    0    NVIDIA A100-SXM4-80GB  81920 MiB  550.54.15   12.4  42\n"
            "    1    NVIDIA A100-SXM4-80GB  81920 MiB  550.54.15   12.4  -\n"
            "gpu-b  drained  preflight: GPU 1 not visible  10.0.0.12  1     no\n"
            "    GPU  PRODUCT                MEMORY     DRIVER      CUDA  JOB\n"
            "    0    NVIDIA H100 80GB HBM3  81559 MiB  535.104.05  12.2  -\n"
            "gpu-c  down     no heartbeat for 12s          10.0.0.13  0     no\n");
}

// With private_data: jobs, a GPU held by another user's job is held, its job not named.
TEST(FormatNodes, AGpuHeldByAJobTheViewerMayNotSeeSaysHeld) {
  auto nodes = parse_nodes(R"([{"name": "gpu-a", "address": "10.0.0.11", "state": "up", "reason": "",
      "gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "driver": "550.54.15",
                "cuda": "12.4", "held": true, "job": null},
               {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "driver": "550.54.15",
                "cuda": "12.4", "held": false, "job": null}]}])");
  ASSERT_TRUE(nodes.has_value()) << nodes.error().message();
  EXPECT_EQ(format_nodes(*nodes),
            "NAME   STATE  REASON  ADDRESS    GPUS  SIMULATED\n"
            "gpu-a  up     -       10.0.0.11  2     no\n"
            "    GPU  PRODUCT                MEMORY     DRIVER     CUDA  JOB\n"
            "    0    NVIDIA A100-SXM4-80GB  81920 MiB  550.54.15  12.4  held\n"
            "    1    NVIDIA A100-SXM4-80GB  81920 MiB  550.54.15  12.4  -\n");
}

// What GET /v1/nodes?gpus=classes gives for the nodes of kNodesJson.
constexpr std::string_view kNodeClassesJson = R"([
  {"name": "gpu-a", "address": "10.0.0.11", "state": "up", "reason": "", "simulated": true, "connected": true,
   "last_seen": "2026-12-02T11:59:59.500Z", "driver": "550.54.15", "cuda": "12.4", "ports": [29500, 29999],
   "gpu_classes": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "driver": "550.54.15", "cuda": "12.4",
                    "count": 2, "used": 1}]},
  {"name": "gpu-b", "address": "10.0.0.12", "state": "drained", "reason": "preflight: GPU 1 not visible",
   "simulated": false, "connected": true, "last_seen": "2026-12-02T11:59:59.000Z", "driver": "535.104.05",
   "cuda": "12.2", "ports": [29500, 29999],
   "gpu_classes": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "535.104.05", "cuda": "12.2",
                    "count": 1, "used": 0}]},
  {"name": "gpu-c", "address": "10.0.0.13", "state": "down", "reason": "no heartbeat for 12s", "simulated": false,
   "connected": false, "last_seen": null, "driver": "", "cuda": "", "ports": [29500, 29999], "gpu_classes": []}
])";

TEST(FormatNodes, ANodeWhoseAgentIsSilentSaysSinceWhenAndWhenItIsLost) {
  auto nodes = parse_nodes(R"([
  {"name": "gpu-a", "address": "10.0.0.11", "state": "up", "reason": "", "simulated": false, "connected": false,
   "last_seen": "2026-12-02T11:59:50.000Z", "silent_since": "2026-12-02T11:59:50.000Z",
   "lost_at": "2026-12-02T12:04:50.000Z", "driver": "", "cuda": "", "ports": [29500, 29999], "gpu_classes": []},
  {"name": "gpu-b", "address": "10.0.0.12", "state": "down", "reason": "no heartbeat for 5m1s", "simulated": false,
   "connected": false, "last_seen": "2026-12-02T11:54:50.000Z", "silent_since": "2026-12-02T11:54:50.000Z",
   "lost_at": null, "driver": "", "cuda": "", "ports": [29500, 29999], "gpu_classes": []}
])");
  ASSERT_TRUE(nodes.has_value()) << nodes.error().message();
  std::string out = format_node_summary(*nodes);
  EXPECT_NE(out.find("agent silent since 2026-12-02T11:59:50.000Z, lost at 2026-12-02T12:04:50.000Z"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("agent silent since 2026-12-02T11:54:50"), std::string::npos)
      << "a lost node says why, as before";
  EXPECT_NE(out.find("no heartbeat for 5m1s"), std::string::npos) << out;
}

TEST(FormatNodes, ALinePerNodeSaysHowManyGpusAJobHoldsAndTheirClass) {
  auto nodes = parse_nodes(kNodeClassesJson);
  ASSERT_TRUE(nodes.has_value()) << nodes.error().message();
  EXPECT_EQ(format_node_summary(*nodes),
            "NAME   STATE    GPUS  USED  CLASS                                                ADDRESS    SIMULATED  "
            "REASON\n"
            "gpu-a  up       2     1     NVIDIA A100-SXM4-80GB, 81920 MiB, driver 550.54.15   10.0.0.11  yes        -\n"
            "gpu-b  drained  1     0     NVIDIA H100 80GB HBM3, 81559 MiB, driver 535.104.05  10.0.0.12  no         "
            "preflight: GPU 1 not visible\n"
            "gpu-c  down     0     0     -                                                    10.0.0.13  no         "
            "no heartbeat for 12s\n");
}

TEST(FormatNodes, ALinePerNodeFromACoordinatorThatListsEachGpuStillCountsThem) {
  auto nodes = parse_nodes(kNodesJson);  // no gpu_classes
  ASSERT_TRUE(nodes.has_value()) << nodes.error().message();
  std::string text = format_node_summary(*nodes);
  EXPECT_NE(text.find("gpu-a  up       2     1     (see --gpus)"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu-c  down     0     0     -"), std::string::npos) << text;
}

TEST(FormatNodes, AMixedNodeCountsEachClassAndAControlCharacterIsNotPrinted) {
  auto nodes = parse_nodes(R"([{"name": "mixed", "address": "10.0.0.9", "state": "up", "reason": "",
      "simulated": false, "gpu_classes": [
        {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "driver": "550.54.15", "count": 2, "used": 2},
        {"name": "NVIDIA L4\u001b[2J", "memory_mib": 23034, "driver": "550.54.15", "count": 1, "used": 0}]}])");
  ASSERT_TRUE(nodes.has_value()) << nodes.error().message();
  std::string text = format_node_summary(*nodes);
  EXPECT_NE(text.find("mixed  up     3     2     2 × NVIDIA A100-SXM4-80GB, 81920 MiB, driver 550.54.15; "
                      "1 × NVIDIA L4"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
}

TEST(FormatDryRun, SaysWhereTheJobWouldStart) {
  auto d = parse_dry_run(R"({"dry_run": true, "would_start": true, "allocation": {
      "nodes": [{"node": "gpu-a", "gpus": [0, 1]}, {"node": "gpu-b", "gpus": [2, 3]}],
      "master_addr": "10.0.0.11", "master_port": 29500}})");
  ASSERT_TRUE(d.has_value()) << d.error().message();
  EXPECT_EQ(format_dry_run(*d),
            "Dry run: the job would start now (nothing was submitted)\n"
            "  nodes:   gpu-a[0,1],gpu-b[2,3]\n"
            "  master:  10.0.0.11:29500\n");
}

TEST(FormatDryRun, SaysWhyTheJobWouldWait) {
  auto d = parse_dry_run(R"({"dry_run": true, "would_start": false, "reason": "NoHomogeneousSet",
      "detail": "no homogeneous set of 8 GPUs: largest free set is 4 × NVIDIA A100-SXM4-80GB on gpu-b"})");
  ASSERT_TRUE(d.has_value()) << d.error().message();
  EXPECT_EQ(
      format_dry_run(*d),
      "Dry run: the job would wait (nothing was submitted)\n"
      "  reason:  NoHomogeneousSet\n"
      "  detail:  no homogeneous set of 8 GPUs: largest free set is 4 × NVIDIA A100-SXM4-80GB on gpu-b\n");
}

TEST(FormatEndState, NamesTheFailedRankAndItsExitCode) {
  auto job = parse_job(kJobJson);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(format_end_state(*job), "Job 43 FAILED (RankFailed): rank 1 on gpu-b, exit code 3");
  auto ok = parse_job(R"({"id": 5, "state": "COMPLETED", "reason": "AllRanksExitedOk", "exit_code": 0})");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(format_end_state(*ok), "Job 5 COMPLETED");
}

TEST(Views, AMistypedFieldIsAnErrorNamingIt) {
  auto jobs = parse_jobs(R"([{"id": 1}, {"id": 2, "gpus": "four"}])");
  ASSERT_FALSE(jobs.has_value());
  EXPECT_EQ(jobs.error().code(), ErrorCode::Internal);
  EXPECT_EQ(jobs.error().message(), "unexpected answer from the coordinator: [1].gpus: must be an integer");
}

TEST(Views, NotJsonIsAnError) {
  EXPECT_FALSE(parse_nodes("<html>").has_value());
  EXPECT_FALSE(parse_jobs(R"({"id": 1})").has_value());
  EXPECT_FALSE(pretty_json("{").has_value());
}

TEST(Views, AListIsReadElementByElementWhateverItsStringsHold) {
  // Commas, brackets, braces and escaped quotes inside strings are not structure.
  auto jobs = parse_jobs(R"( [ {"id": 1, "name": "a,]}b", "detail": "say \"[x, {y}]\""} ,
                               {"id": 2, "node_list": ["n1", "n2"], "rendezvous": {"ranks": 2, "waiting_for": []}} ] )");
  ASSERT_TRUE(jobs.has_value()) << jobs.error().message();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].name, "a,]}b");
  EXPECT_EQ((*jobs)[0].detail, "say \"[x, {y}]\"");
  EXPECT_EQ((*jobs)[1].node_list, (std::vector<std::string>{"n1", "n2"}));
  ASSERT_TRUE(parse_jobs(" [ ] ").has_value());
  EXPECT_TRUE(parse_jobs(" [ ] ")->empty());
  for (const char* bad : {"[{\"id\": 1},]", "[{\"id\": 1}", "[{\"id\": 1}}]", "[\"open]", "[,]", "[{\"id\": 1} {\"id\": 2}]"}) {
    EXPECT_FALSE(parse_jobs(bad).has_value()) << bad;
  }
  auto second = parse_jobs(R"([{"id": 1}, {"id": ]])");
  ASSERT_FALSE(second.has_value());
  EXPECT_NE(second.error().message().find("[1]: malformed JSON"), std::string::npos) << second.error().message();
}

TEST(Views, PrettyJsonKeepsTheCoordinatorsKeyOrder) {
  auto p = pretty_json(R"({"id":42,"name":"x","attempt":0})");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, "{\n  \"id\": 42,\n  \"name\": \"x\",\n  \"attempt\": 0\n}\n");
}

TEST(Views, LogChunksAndProblemsAreRead) {
  auto c = parse_log_chunk(
      R"({"rank": 1, "node": "gpu-a", "offset": 10, "data": "hi\n", "size": 13, "finished": true})");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->offset, 10u);
  EXPECT_EQ(c->data, "hi\n");
  EXPECT_TRUE(c->finished);
  EXPECT_EQ(parse_problems(R"({"error": "invalid job spec", "problems": ["a", "b"]})"),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(parse_problems(R"({"error": "nope"})").empty());
}

TEST(FormatUsage, SaysWhenTheTotalIsTheCallersOwnJobsAlone) {
  constexpr std::string_view kUsage = R"({"since": "2026-12-01T12:00:00.000Z", "until": "2026-12-02T12:00:00.000Z",
    "by": "node", "total_gpu_hours": 3.5, %s "rows": [{"node": "gpu-a", "gpu_hours": 3.5, "jobs": 2}]})";
  auto with = [&](const std::string& own) {
    std::string text(kUsage);
    text.replace(text.find("%s"), 2, own);
    auto u = parse_usage(text);
    EXPECT_TRUE(u.has_value()) << u.error().message();
    return u ? format_usage(*u) : std::string();
  };
  EXPECT_EQ(with("").substr(0, with("").find('\n')), "GPU-hours from 2026-12-01T12:00:00.000Z to 2026-12-02T12:00:00.000Z");
  std::string own = with(R"("own_only": true,)");
  EXPECT_EQ(own.substr(0, own.find('\n')),
            "GPU-hours of your own jobs from 2026-12-01T12:00:00.000Z to 2026-12-02T12:00:00.000Z");
  EXPECT_NE(own.find("gpu-a"), std::string::npos) << own;
}

}  // namespace
}  // namespace corral::cli
