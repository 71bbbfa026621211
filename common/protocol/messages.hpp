#pragma once
// The agent <-> coordinator protocol: plain structs, one JSON object per WebSocket text
// message, {"type": "...", ...}. docs/protocol.md documents each with an example. No
// sockets here; codec.hpp turns these into text and back.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/model/inventory.hpp"
#include "common/model/job.hpp"

namespace corral::protocol {

// 2: Synced, AttemptGone and Ack; Kill is answered by AttemptGone.
inline constexpr int kProtocolVersion = 2;

// A rank process an agent runs.
struct RunningRank {
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  int pid = 0;
  bool operator==(const RunningRank&) const = default;
};

// ---- agent -> coordinator

// First message on every connection. The node name comes from the certificate; `node`
// must match it.
struct Hello {
  int version = kProtocolVersion;
  std::string node;
  std::string address;          // advertised: MASTER_ADDR for jobs whose rank 0 runs here
  model::PortRange ports;
  bool simulated = false;
  std::string driver;
  model::CudaVersion cuda;
  std::vector<model::Gpu> gpus;
  std::string health_error;     // empty: preflight passed
  std::vector<RunningRank> running;
  // The cluster whose coordinator welcomed this agent process first; empty before any
  // welcome. A coordinator of another cluster gets its reports, but never acts on them.
  std::string cluster;
  bool operator==(const Hello&) const = default;
};

struct Heartbeat {
  bool operator==(const Heartbeat&) const = default;
};

// Preflight ran again: the node is healthy or should be drained with this reason.
struct Health {
  std::string error;            // empty: healthy
  bool operator==(const Health&) const = default;
};

// Answer to Prepare.
struct PrepareResult {
  model::JobId job = 0;
  int attempt = 0;
  bool ok = false;
  bool port_busy = false;       // the master port is held by a process outside corral
  std::string nccl_id;          // 256 hex characters for NCCL jobs
  std::string error;
  // The port the Prepare asked about: an answer sent again after a reconnect may be about
  // a port the attempt has since moved off (PortBusy), and is then stale.
  int master_port = 0;
  bool operator==(const PrepareResult&) const = default;
};

struct RankStarted {
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  int pid = 0;
  bool operator==(const RankStarted&) const = default;
};

struct RankExited {
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  int exit_code = 0;            // valid when signal == 0
  int signal = 0;               // the signal that killed it, or 0
  std::string reason;           // "exited with code 3", "killed by signal 9", "no such user alice"
  bool launch_failure = false;  // it never ran the job's command (bad user, workdir, ...)
  // When the agent saw it end, by the node's clock (ms since the epoch; 0: unknown, as
  // from an older agent). A report held back through an outage still dates the end.
  std::int64_t ended_at_ms = 0;
  bool operator==(const RankExited&) const = default;
};

// Answer to LogRequest.
struct LogData {
  std::uint64_t request = 0;
  std::string data;             // bytes of the log from `offset`
  std::uint64_t offset = 0;     // where data starts
  std::uint64_t size = 0;       // the log's size now
  bool finished = false;        // the rank has exited: the log will not grow
  std::string error;
  std::uint64_t cut = 0;        // bytes cut from the log's middle (the agent's rank_log_cap)
  std::string lost;             // why output may be missing from the log (a full spool), or ""
  bool operator==(const LogData&) const = default;
};

// Sent once after each Welcome, after every message held back while the link was down:
// from here on the coordinator knows all the agent knows, and a rank of this node that
// it still counts as running but the agent neither runs nor reported is truly lost.
struct Synced {
  bool operator==(const Synced&) const = default;
};

// No process of this attempt is left on the node: every rank's process group is empty
// and no process carries the attempt's CORRAL_JOB_ID and CORRAL_ATTEMPT. Sent when the
// node's ranks of the attempt have all ended, and in answer to every Kill (also for an
// attempt the agent never ran or has forgotten).
struct AttemptGone {
  model::JobId job = 0;
  int attempt = 0;
  bool operator==(const AttemptGone&) const = default;
};

// A rank checked in to its job's rendezvous, as the agent saw in /proc: rank 0 listens
// on MASTER_PORT, any other rank holds a connection to MASTER_ADDR:MASTER_PORT. Sent once
// per rank and attempt (torch mode).
struct RankJoined {
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  bool operator==(const RankJoined&) const = default;
};

// What a rank's processes are doing, from /proc.
struct RankProcess {
  int rank = 0;
  bool alive = false;
  int pid = 0;                 // the process described: the busiest of the rank's group
  std::string command;         // its comm
  std::string state;           // "S (sleeping)"
  std::string wchan;           // the kernel function it waits in; empty when unknown
  std::int64_t cpu_ms = 0;     // CPU time of all the rank's processes since it started
  int processes = 0;           // processes in the rank's group
  bool operator==(const RankProcess&) const = default;
};

// The answer to Inspect. Not a report: a lost one is only missing from a message.
struct Inspection {
  model::JobId job = 0;
  int attempt = 0;
  std::vector<RankProcess> ranks;
  bool operator==(const Inspection&) const = default;
};

// A rank of a job with launch.hang_timeout stopped making progress (its processes used
// under 1 % of a core since `idle_ms` ago, which is at least the timeout), or, with
// `stalled` false, moves again. `state` is its busiest process's, as in RankProcess.
struct RankStall {
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  bool stalled = false;
  std::int64_t idle_ms = 0;
  std::string state;
  bool operator==(const RankStall&) const = default;
};

// Something the agent found wrong with a rank, for its record and the job's events (a
// GPU it uses that is not its own). Sent once per rank and text.
struct RankWarning {
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  std::string warning;
  bool operator==(const RankWarning&) const = default;
};

// The most a rank's stack report may hold.
inline constexpr std::size_t kMaxStackReportBytes = std::size_t{1} << 20;

// One rank's stack report: /proc state of each of its processes and threads, native
// stacks (gdb) and Python stacks (py-spy) where those are installed.
struct RankStack {
  int rank = 0;
  std::string report;
  bool operator==(const RankStack&) const = default;
};

// The answer to StackRequest. Not a report.
struct Stacks {
  std::uint64_t request = 0;
  std::vector<RankStack> ranks;
  bool operator==(const Stacks&) const = default;
};

using AgentMessage =
    std::variant<Hello, Heartbeat, Health, PrepareResult, RankStarted, RankExited, LogData, Synced, AttemptGone,
                 RankJoined, Inspection, RankStall, Stacks, RankWarning>;

// ---- coordinator -> agent

struct Welcome {
  int version = kProtocolVersion;
  std::int64_t heartbeat_interval_ms = 1000;
  std::int64_t kill_grace_ms = 10000;
  std::string cluster;  // the coordinator's cluster identity (empty from an older one)
  bool operator==(const Welcome&) const = default;
};

// The jobs the coordinator runs on this node; the agent kills ranks of any other job.
// Sent after Hello once the coordinator knows (after its reconnect grace, on restart).
struct Reconcile {
  std::vector<std::pair<model::JobId, int>> keep;  // (job, attempt)
  bool operator==(const Reconcile&) const = default;
};

// Rank 0's node: probe the master port (and keep it bound), start the NCCL root.
struct Prepare {
  model::JobId job = 0;
  int attempt = 0;
  std::string master_addr;
  int master_port = 0;
  bool nccl = false;
  bool operator==(const Prepare&) const = default;
};

struct RankSpec {
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
  std::vector<int> gpus;        // GPU indices on the node (CUDA_VISIBLE_DEVICES)
  bool operator==(const RankSpec&) const = default;
};

// The one rendezvous record, sent to every agent of the job; each starts its own ranks.
struct Launch {
  model::JobId job = 0;
  int attempt = 0;
  std::string name;
  std::string user;
  model::Command command;
  std::string workdir;
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> nodes;    // node_rank order
  int world_size = 0;
  int local_world_size = 0;
  std::string master_addr;
  int master_port = 0;
  std::string nccl_id;               // empty unless launch.mode is nccl
  bool gpus_per_rank = false;        // launch.gpu_visibility: rank (else every rank sees the node's)
  int max_restarts = 0;              // the job's retries (TORCHELASTIC_MAX_RESTARTS)
  std::int64_t hang_timeout_ms = 0;  // launch.hang_timeout; 0: not watched
  std::vector<RankSpec> ranks;       // the ranks of the receiving node
  bool operator==(const Launch&) const = default;
};

struct Kill {
  model::JobId job = 0;
  int attempt = 0;
  std::int64_t grace_ms = 10000;
  bool operator==(const Kill&) const = default;
};

struct LogRequest {
  std::uint64_t request = 0;
  model::JobId job = 0;
  int attempt = 0;
  int rank = 0;
  std::uint64_t offset = 0;
  std::uint64_t max_bytes = 1 << 20;
  bool operator==(const LogRequest&) const = default;
};

// Every report (any message but hello, heartbeat, log_data and synced) the agent sent on
// this connection, counted from its start, up to `received` is committed: the agent may
// forget them. Reports not acknowledged when a connection ends are sent again on the
// next (the coordinator ignores repeats), so none is lost with a coordinator that dies
// while reading it.
struct Ack {
  std::uint64_t received = 0;
  bool operator==(const Ack&) const = default;
};

// Describe these ranks of the attempt (answered with Inspection): a rendezvous that did
// not complete names what each missing rank is doing.
struct Inspect {
  model::JobId job = 0;
  int attempt = 0;
  std::vector<int> ranks;
  bool operator==(const Inspect&) const = default;
};

// Gather these ranks' stacks (corral stack), answered with Stacks.
struct StackRequest {
  std::uint64_t request = 0;
  model::JobId job = 0;
  int attempt = 0;
  std::vector<int> ranks;
  bool operator==(const StackRequest&) const = default;
};

using CoordinatorMessage =
    std::variant<Welcome, Reconcile, Prepare, Launch, Kill, LogRequest, Ack, Inspect, StackRequest>;

// What Ack counts, on both sides: every agent message but hello, heartbeat, log_data,
// synced, inspection and stacks.
inline bool is_report(const AgentMessage& m) {
  return !std::holds_alternative<Hello>(m) && !std::holds_alternative<Heartbeat>(m) &&
         !std::holds_alternative<LogData>(m) && !std::holds_alternative<Synced>(m) &&
         !std::holds_alternative<Inspection>(m) && !std::holds_alternative<Stacks>(m);
}

}  // namespace corral::protocol
