#pragma once
// The end-to-end fixture: a corral cluster spread over network namespaces, one per host,
// on a private bridge (tests/support/netns.hpp). Host 0 runs the coordinator; hosts 1 to
// 3 each run an agent (nodes "node1" to "node3", simulated inventories) that advertises
// its namespace address, so ranks rendezvous over real non-loopback addresses. The test
// itself talks to the coordinator over HTTPS through the bridge. Everything runs on the
// test's thread; daemons are real processes, killed and the lab removed when a test ends.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/core/time.hpp"
#include "common/model/job.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/netns.hpp"

namespace corral::e2e {

using namespace std::chrono_literals;
using Json = nlohmann::json;

using testing::current_user;
using testing::eventually;
using testing::running;

class NetnsCluster : public ::testing::Test {
 protected:
  static constexpr int kAgents = 3;
  static constexpr std::chrono::milliseconds kNodeTimeout = testing::CoordinatorProcess::kNodeTimeout;
  static constexpr std::chrono::milliseconds kNodeLostTimeout = testing::CoordinatorProcess::kNodeLostTimeout;

  // One simulated inventory (YAML) per agent. By default every node has two GPUs of one class.
  virtual std::vector<std::string> inventories() const {
    std::string two_a100 =
        "driver: \"550.54.15\"\ncuda: \"12.4\"\n"
        "gpus: [{name: \"NVIDIA A100-SXM4-80GB\", memory_mb: 81920, count: 2, nvlink: true}]\n";
    return std::vector<std::string>(kAgents, two_a100);
  }

  void SetUp() override {
    lab_ = std::make_unique<testing::NetnsLab>(1 + kAgents);
    if (!lab_->ok()) GTEST_SKIP() << "cannot make network namespaces here: " << lab_->error();
    coord_ = std::make_unique<testing::CoordinatorProcess>(
        dir_, "", current_user(), testing::Placement{lab_->host(0).address, lab_->exec(0)});
    ASSERT_TRUE(coord_->init_ok());
    ASSERT_TRUE(coord_->start());
    http_ = coord_->client(70s);
    ASSERT_NE(http_, nullptr);
    std::vector<std::string> sims = inventories();
    for (int i = 1; i <= kAgents; ++i) {
      std::string sim = dir_.file("sim-" + std::to_string(i) + ".yaml");
      std::ofstream(sim) << sims.at(static_cast<std::size_t>(i - 1));
      agents_.push_back(std::make_unique<testing::AgentProcess>(
          *coord_, dir_, node_name(i), sim, testing::Placement{lab_->host(i).address, lab_->exec(i)},
          "29500-29599"));  // each host has its own addresses: the usual range
    }
    for (auto& agent : agents_) ASSERT_TRUE(agent->start());
  }

  void TearDown() override {
    if (!HasFailure()) return;
    if (coord_) {
      for (const auto& line : coord_->process().lines()) std::cerr << "coordinator: " << line << "\n";
    }
    for (std::size_t i = 0; i < agents_.size(); ++i) {
      for (const auto& line : agents_[i]->process().lines()) {
        std::cerr << "node" << i + 1 << ": " << line << "\n";
      }
    }
  }

  static std::string node_name(int host) { return "node" + std::to_string(host); }
  int host_of(const std::string& node) const { return std::stoi(node.substr(4)); }
  std::string address_of(const std::string& node) const { return lab_->host(host_of(node)).address; }
  testing::AgentProcess& agent(const std::string& node) {
    return *agents_.at(static_cast<std::size_t>(host_of(node) - 1));
  }

  net::HttpResponse call(const std::string& method, const std::string& target, const std::string& body = {}) {
    auto r = http_->request(method, target, body, {{"Authorization", "Bearer " + coord_->token()}});
    EXPECT_TRUE(r.has_value()) << method << " " << target << ": " << r.error().message();
    return r ? *r : net::HttpResponse{0, "", "", {}};
  }

  static Json parse(const std::string& body) {
    Json j = Json::parse(body, nullptr, false);
    return j.is_discarded() ? Json() : j;
  }

  model::JobId submit(const std::string& spec) {
    auto r = call("POST", "/v1/jobs", Json{{"spec", spec}, {"file", "job.yaml"}}.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    return r.status == 201 ? parse(r.body)["id"].get<model::JobId>() : 0;
  }

  // Runs the corral CLI in the test's own namespace, as a person on their machine would.
  std::pair<int, std::string> cli(std::vector<std::string> args) {
    args.insert(args.begin(), CORRAL_CLI_BIN);
    return testing::run(args, {"CORRAL_URL=" + coord_->url(), "CORRAL_TOKEN=" + coord_->token(),
                               "CORRAL_CA=" + coord_->ca(), "CORRAL_KEEP_CONNECTION=0"});
  }

  Json job(model::JobId id) { return parse(call("GET", "/v1/jobs/" + std::to_string(id)).body); }

  // The job's "hang: ..." event, "" while it has none; `j` is the job as it was read.
  std::string hang_event(model::JobId id, Json& j) {
    j = job(id);
    std::string hang;
    for (const auto& e : j["events"]) {
      if (e["text"].get<std::string>().starts_with("hang:")) hang = e["text"];
    }
    return hang;
  }

  // The job once it has ended: the coordinator answers the long poll at its end (or
  // after `seconds`, with the job as it is then).
  Json wait_end(model::JobId id, int seconds = 30) {
    return parse(call("GET", "/v1/jobs/" + std::to_string(id) + "?wait=" + std::to_string(seconds)).body);
  }

  // A job reaching RUNNING is no end: nothing to long-poll, so poll.
  bool reaches(model::JobId id, const std::string& state, std::chrono::milliseconds timeout = 15s) {
    return eventually([&] { return job(id)["state"] == state; }, timeout);
  }

  // When the first of the job's events whose text starts with `prefix` happened.
  static std::optional<std::chrono::system_clock::time_point> event_time(const Json& j,
                                                                         const std::string& prefix) {
    for (const auto& e : j["events"]) {
      if (!e["text"].get<std::string>().starts_with(prefix)) continue;
      auto at = parse_rfc3339(e["at"].get<std::string>());
      if (!at) return std::nullopt;
      return std::chrono::system_clock::time_point(*at);
    }
    return std::nullopt;
  }

  Json nodes() { return parse(call("GET", "/v1/nodes").body); }
  Json node(const std::string& name) {
    for (const auto& n : nodes()) {
      if (n["name"] == name) return n;
    }
    return Json();
  }

  std::string log(model::JobId id, int rank) {
    auto r = call("GET", "/v1/jobs/" + std::to_string(id) + "/logs?rank=" + std::to_string(rank));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? parse(r.body)["data"].get<std::string>() : "";
  }

  // The JSON line a rank printed (tcp-check and the DDP example print one each).
  Json rank_line(model::JobId id, int rank) {
    std::string text = log(id, rank);
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("{")) return parse(line);
    }
    ADD_FAILURE() << "rank " << rank << " of job " << id << " printed no JSON line:\n" << text;
    return Json();
  }

  static std::vector<int> pids(const Json& j) {
    std::vector<int> out;
    for (const auto& r : j["ranks"]) {
      if (r["pid"].is_number()) out.push_back(r["pid"].get<int>());
    }
    return out;
  }

  static std::vector<int> pids_on(const Json& j, const std::string& node) {
    std::vector<int> out;
    for (const auto& r : j["ranks"]) {
      if (r["node"] == node && r["pid"].is_number()) out.push_back(r["pid"].get<int>());
    }
    return out;
  }

  // Every process in the lab's namespaces whose environment says it belongs to the job:
  // ranks and whatever they started (all hosts share the test's pid namespace).
  std::vector<int> job_processes(model::JobId id) const {
    std::set<ino_t> lab;
    for (int i = 0; i < lab_->hosts(); ++i) lab.insert(lab_->namespace_inode(i));
    std::string needle = "CORRAL_JOB_ID=" + std::to_string(id);
    std::vector<int> found;
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return found;
    while (const dirent* e = ::readdir(proc)) {
      int pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      struct stat ns {};
      std::string base = std::string("/proc/") + e->d_name;
      if (::stat((base + "/ns/net").c_str(), &ns) != 0 || !lab.contains(ns.st_ino)) continue;
      std::ifstream in(base + "/environ", std::ios::binary);
      for (std::string var; std::getline(in, var, '\0');) {
        if (var == needle) {
          if (running(pid)) found.push_back(pid);
          break;
        }
      }
    }
    ::closedir(proc);
    return found;
  }

  static bool all_gone(const std::vector<int>& pids, std::chrono::milliseconds timeout = 5s) {
    return eventually([&] { return std::none_of(pids.begin(), pids.end(), running); }, timeout);
  }

  // What of the job still runs once `timeout` has passed: "" when no rank of it and nothing
  // a rank started runs any more, on any host.
  std::string left_running(model::JobId id, const std::vector<int>& ranks,
                           std::chrono::milliseconds timeout = 5s) {
    auto left = [&] {
      std::set<int> all(ranks.begin(), ranks.end());
      std::erase_if(all, [](int pid) { return !running(pid); });
      for (int pid : job_processes(id)) all.insert(pid);
      return all;
    };
    if (eventually([&] { return left().empty(); }, timeout)) return "";
    std::string text = "job " + std::to_string(id) + " still has processes:";
    for (int pid : left()) text += " " + std::to_string(pid);
    return text;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::NetnsLab> lab_;
  std::unique_ptr<testing::CoordinatorProcess> coord_;
  std::unique_ptr<net::HttpClient> http_;
  std::vector<std::unique_ptr<testing::AgentProcess>> agents_;
};

}  // namespace corral::e2e
