#pragma once
// Agent: one per node. Dials the coordinator (so it works behind NAT), reports the
// node, probes master ports, hosts the NCCL bootstrap root in a child, starts and kills
// ranks, keeps their logs and serves them. Ranks keep running while the coordinator is
// away; what happened meanwhile is sent when the link is back. Lives on one event loop
// thread.

#include <sys/types.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model/config.hpp"
#include "common/net/event_loop.hpp"
#include "common/net/ws_client.hpp"
#include "common/protocol/messages.hpp"

namespace corral::agent {

struct AgentHooks {
  // Runs the node checklist; "" when healthy, else why the node should be drained.
  std::function<std::string()> preflight;
  // After a job's ranks are gone: descriptions of any of these GPU UUIDs still held by
  // a process (nvidia-smi --query-compute-apps); empty on simulated nodes.
  std::function<std::vector<std::string>(const std::vector<std::string>& uuids)> gpus_still_held;
};

class Agent {
 public:
  // `node` carries everything Hello reports but the running ranks.
  Agent(net::EventLoop& loop, model::AgentConfig config, protocol::Hello node, AgentHooks hooks);
  ~Agent();

  // Kills ranks an earlier agent process left behind, then connects.
  Result<void> start();
  void stop();

  bool connected() const { return welcomed_; }
  std::size_t running_ranks() const;

 private:
  using Key = std::pair<model::JobId, int>;  // (job, attempt)
  struct Rank {
    int rank = 0;
    pid_t pid = 0;
    bool exited = false;
    std::string log;
    std::vector<int> gpus;
  };
  struct Job {
    std::map<int, Rank> ranks;
    int probe_fd = -1;          // the master port, held from Prepare until rank 0 starts
    pid_t nccl_root = 0;
    int nccl_root_stdin = -1;   // closing it ends nccl-root
    bool killing = false;
    std::unique_ptr<net::Timer> kill_timer;
    std::vector<int> gpus;
  };

  void connect();
  void on_open();
  void on_close(const std::string& reason);
  void on_message(std::string text);
  void send(const protocol::AgentMessage& message);
  void flush_outbox();

  void on_welcome(const protocol::Welcome& m);
  void on_reconcile(const protocol::Reconcile& m);
  void on_prepare(const protocol::Prepare& m);
  void on_launch(const protocol::Launch& m);
  void on_kill(const protocol::Kill& m);
  void on_log_request(const protocol::LogRequest& m);
  void on_ack(const protocol::Ack& m);

  void launch_failed(const protocol::Launch& m, const std::string& reason);
  void reap();
  void rank_done(const Key& key, Rank& rank, int status);
  void kill_job(const Key& key, Duration grace);
  void finish_kill(const Key& key);
  void verify_gone(const Key& key, int tries);
  void remember_finished(const Key& key);
  void release_job_resources(Job& job);
  // A rank of an attempt that was launched here before: how it ended, from the spool.
  protocol::RankExited ended_before(model::JobId job, int attempt, int rank) const;
  std::string log_path(model::JobId job, int attempt, int rank) const;
  std::string marker_path(model::JobId job, int attempt, int rank) const;
  void kill_orphans();
  Result<std::string> load_agent_id() const;
  void run_preflight();

  net::EventLoop& loop_;
  model::AgentConfig config_;
  protocol::Hello node_;
  AgentHooks hooks_;
  std::unique_ptr<net::WsClient> ws_;
  bool welcomed_ = false;
  bool stopping_ = false;
  Duration backoff_ = std::chrono::milliseconds(100);
  std::unique_ptr<net::Timer> reconnect_timer_;
  std::unique_ptr<net::Timer> heartbeat_timer_;
  std::unique_ptr<net::Timer> preflight_timer_;
  Duration heartbeat_interval_ = std::chrono::seconds(1);
  std::deque<std::string> outbox_;   // encoded messages waiting for the link
  // Reports sent on this connection that the coordinator has not acknowledged yet; sent
  // again on the next connection if this one ends first.
  std::deque<std::string> unacked_;
  std::uint64_t acked_ = 0;          // reports of this connection acknowledged so far
  std::map<Key, Job> jobs_;
  std::deque<Key> finished_;         // attempts that ended here, most recent last
  std::string agent_id_;             // CORRAL_AGENT_ID of the ranks started here
  std::string interface_;
  std::string health_error_;
};

}  // namespace corral::agent
