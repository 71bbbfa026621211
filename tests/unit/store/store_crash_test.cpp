// The crash test: nothing SqliteStore acknowledged is lost when the process dies.
//
// A child process commits changes in a loop (single changes and batches) and, after each
// commit() returns, writes the acknowledged (job, stage) pairs to a pipe. The parent reads
// acknowledgements, kills the child with SIGKILL after a random number of them, reopens
// the file and checks that every acknowledged change is there with its exact fields and
// events, that nothing is half-applied, and that PRAGMA integrity_check says "ok". Then a
// new child continues on the same file. Pipe reads and waitpid are the only
// synchronisation; there are no sleeps.

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/store/sqlite_store.hpp"
#include "tests/unit/store/temp_dir.hpp"

namespace corral::store {
namespace {

constexpr int kKills = 20;
constexpr int kMaxAcksBeforeKill = 120;
constexpr std::uint64_t kDefaultSeed = 20240617;

// Each job walks stage 0 (PENDING), 1 (RUNNING, holding GPUs and a port), 2 (COMPLETED).
// Every field is a function of (id, stage), so the parent can rebuild what it expects.
struct Ack {
  std::int64_t id;
  std::int64_t stage;
};

model::Allocation allocation_for(model::JobId id) {
  // 4 nodes x 8 GPUs and 16 ports per host: running jobs collide now and then, so some
  // changes fail with Conflict and must be rolled back alone inside their batch.
  int node = static_cast<int>((id / 8) % 4);
  std::string name = "node-" + std::to_string(node);
  return model::Allocation{{{name, {static_cast<int>(id % 8)}}},
                           "10.0.0." + std::to_string(node),
                           29500 + static_cast<int>(id % 16)};
}

JobRecord record_for(model::JobId id, int stage) {
  JobRecord job;
  job.id = id;
  job.user = "user-" + std::to_string(id % 3);
  job.name = "crash-" + std::to_string(id);
  job.spec_yaml = "name: crash-" + std::to_string(id) + "\nresources:\n  gpus: 1\n";
  job.reason = "Resources";
  job.submitted_at = from_millis(1'700'000'000'000 + id);
  if (stage >= 1) {
    job.state = model::JobState::Running;
    job.reason.clear();
    job.attempt = 1;
    job.started_at = from_millis(1'700'000'500'000 + id);
    job.allocation = allocation_for(id);
    job.nccl_id = std::string(256, static_cast<char>('a' + id % 6));
  }
  if (stage >= 2) {
    job.state = model::JobState::Completed;
    job.reason = "all ranks exited 0";
    job.ended_at = from_millis(1'700'000'900'000 + id);
    job.exit_code = 0;
  }
  return job;
}

JobEvent event_for(model::JobId id, int stage) {
  return {id, from_millis(id * 10 + stage), "stage " + std::to_string(stage)};
}

std::vector<JobEvent> events_for(model::JobId id, int stage) {
  std::vector<JobEvent> out;
  for (int s = 0; s <= stage; ++s) out.push_back(event_for(id, s));
  return out;
}

int stage_of(model::JobState state) {
  switch (state) {
    case model::JobState::Pending:
      return 0;
    case model::JobState::Running:
      return 1;
    case model::JobState::Completed:
      return 2;
    default:
      return -1;
  }
}

[[noreturn]] void child_fail(const std::string& what) {
  std::fprintf(stderr, "crash test child: %s\n", what.c_str());
  std::_Exit(3);
}

// Runs until killed. The test process is single-threaded when it forks, so the child may
// allocate and open the database like any process; it never returns into GoogleTest.
[[noreturn]] void run_child(const std::string& path, std::uint64_t seed, int ack_fd) {
  auto opened = SqliteStore::open(path);
  if (!opened) child_fail(opened.error().to_string());
  SqliteStore& store = **opened;
  auto snap = store.load();
  if (!snap) child_fail(snap.error().to_string());
  std::map<model::JobId, int> active;  // id -> stage, for stages 0 and 1
  for (const auto& job : snap->active_jobs) active[job.id] = stage_of(job.state);
  model::JobId next_id = snap->max_job_id + 1;
  std::mt19937_64 rng(seed);

  while (true) {
    std::size_t size = rng() % 2 == 0 ? 1 : 2 + rng() % 7;
    std::vector<Change> batch;
    std::vector<Ack> planned;
    std::map<model::JobId, bool> used;  // a job changes at most once per batch
    for (std::size_t i = 0; i < size; ++i) {
      Change c;
      if (active.empty() || rng() % 3 == 0) {
        model::JobId id = next_id++;
        c.mutations = {InsertJob{record_for(id, 0)}, AppendEvent{event_for(id, 0)}};
        planned.push_back({id, 0});
      } else {
        auto it = active.begin();
        std::advance(it, static_cast<long>(rng() % active.size()));
        if (used[it->first]) continue;
        used[it->first] = true;
        int stage = it->second + 1;
        c.mutations = {AppendEvent{event_for(it->first, stage)}, UpdateJob{record_for(it->first, stage)}};
        planned.push_back({it->first, stage});
      }
      batch.push_back(std::move(c));
    }
    auto results = store.commit(batch);
    std::vector<Ack> acks;
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i]) {
        if (results[i].error().code() != ErrorCode::Conflict) child_fail(results[i].error().to_string());
        continue;
      }
      const Ack& a = planned[i];
      if (a.stage == 2) {
        active.erase(a.id);
      } else {
        active[a.id] = static_cast<int>(a.stage);
      }
      acks.push_back(a);
    }
    // At most 9 acks: one write under PIPE_BUF, so it lands whole or not at all.
    const char* data = reinterpret_cast<const char*>(acks.data());
    std::size_t left = acks.size() * sizeof(Ack);
    while (left > 0) {
      ssize_t n = ::write(ack_fd, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) child_fail(std::string("write ack: ") + std::strerror(errno));
      data += n;
      left -= static_cast<std::size_t>(n);
    }
  }
}

std::string integrity_check(const std::string& path) {
  sqlite3* db = nullptr;
  std::string out = "open failed";
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    } else {
      out = sqlite3_errmsg(db);
    }
    sqlite3_finalize(stmt);
  }
  sqlite3_close_v2(db);
  return out;
}

// Reads acks until `want` have arrived or the pipe reaches end of file; returns how many
// were read. A trailing partial ack (cannot happen with atomic pipe writes) is dropped.
int read_acks(int fd, int want, std::map<model::JobId, int>& acked, std::string& pending_bytes) {
  int got = 0;
  char buf[4096];
  while (want < 0 || got < want) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending_bytes.append(buf, static_cast<std::size_t>(n));
    while (pending_bytes.size() >= sizeof(Ack)) {
      Ack a;
      std::memcpy(&a, pending_bytes.data(), sizeof a);
      pending_bytes.erase(0, sizeof a);
      int& stage = acked[a.id];
      stage = std::max(stage, static_cast<int>(a.stage));
      ++got;
    }
  }
  return got;
}

TEST(StoreCrash, AcknowledgedChangesSurviveSigkill) {
  std::uint64_t seed = kDefaultSeed;
  if (const char* env = std::getenv("CORRAL_CRASH_SEED")) seed = std::strtoull(env, nullptr, 10);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (set CORRAL_CRASH_SEED to replay another)");
  testing::TempDir dir;
  std::string path = dir.file("crash.db");
  std::mt19937_64 rng(seed);
  // What must be on disk: the highest acknowledged stage of each job, raised after each
  // check to what the file holds (a commit can land just before the kill, unacknowledged).
  std::map<model::JobId, int> expected;
  int total_acks = 0;
  int landed_unacknowledged = 0;

  for (int round = 0; round < kKills; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0) << std::strerror(errno);
    std::fflush(nullptr);  // so the child does not write our buffered output twice
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      ::close(fds[0]);
      run_child(path, seed + static_cast<std::uint64_t>(round) + 1, fds[1]);
    }
    ::close(fds[1]);

    int want = 1 + static_cast<int>(rng() % kMaxAcksBeforeKill);
    std::map<model::JobId, int> acked;
    std::string partial;
    int got = read_acks(fds[0], want, acked, partial);
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    // Acks already in the pipe when the child died were acknowledged too.
    got += read_acks(fds[0], -1, acked, partial);
    ::close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the child ended by itself (status " << status << ") after " << got << " of " << want << " acks";
    total_acks += got;
    for (const auto& [id, stage] : acked) expected[id] = std::max(expected[id], stage);

    ASSERT_EQ(integrity_check(path), "ok");
    auto opened = SqliteStore::open(path);
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    SqliteStore& store = **opened;
    auto all = store.jobs({});
    ASSERT_TRUE(all.has_value()) << all.error().to_string();
    std::map<model::JobId, int> on_disk;
    for (const JobRecord& job : *all) {
      int stage = stage_of(job.state);
      ASSERT_GE(stage, 0) << "job " << job.id;
      ASSERT_EQ(job, record_for(job.id, stage)) << "job " << job.id;
      // The event and the state change are one Change: never one without the other.
      ASSERT_EQ(store.events(job.id).value(), events_for(job.id, stage)) << "job " << job.id;
      on_disk[job.id] = stage;
    }
    for (const auto& [id, stage] : expected) {
      ASSERT_TRUE(on_disk.contains(id)) << "acknowledged job " << id << " is lost";
      EXPECT_GE(on_disk[id], stage) << "job " << id << " lost an acknowledged change";
      EXPECT_LE(on_disk[id], stage + 1) << "job " << id << " has changes nobody made";
    }
    for (const auto& [id, stage] : on_disk) {
      auto it = expected.find(id);
      if (it == expected.end() || stage > it->second) ++landed_unacknowledged;
    }
    expected = on_disk;
  }
  std::printf(
      "crash test: %d kills, %d acknowledged changes, %d more committed but killed before the ack, %zu "
      "jobs\n",
      kKills, total_acks, landed_unacknowledged, expected.size());
  EXPECT_GT(total_acks, kKills);
}

}  // namespace
}  // namespace corral::store
