// Golden scenarios: tests/scenarios/*.scn hold a script of cluster events and, after a
// line "----", the decisions and pending reasons the core must produce, as people read
// them. Run with CORRAL_UPDATE_GOLDEN=1 to rewrite the expected part after a deliberate
// change, then review the diff.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/core/strings.hpp"
#include "coordinator/sched/scheduler.hpp"
#include "tests/unit/sched/builders.hpp"

namespace corral::sched {
namespace {

namespace fs = std::filesystem;
using model::JobState;

std::vector<std::string> tokenize(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  bool any = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (c == ' ' && !quoted) {
      if (any) out.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) out.push_back(cur);
  return out;
}

// key=value arguments after the positional ones.
std::map<std::string, std::string> options(const std::vector<std::string>& tokens, std::size_t from) {
  std::map<std::string, std::string> out;
  for (std::size_t i = from; i < tokens.size(); ++i) {
    auto eq = tokens[i].find('=');
    if (eq == std::string::npos) {
      out[tokens[i]] = "";
    } else {
      out[tokens[i].substr(0, eq)] = tokens[i].substr(eq + 1);
    }
  }
  return out;
}

class ScenarioRunner {
 public:
  std::string run(const std::vector<std::string>& script) {
    for (const auto& line : script) {
      if (line.empty() || line[0] == '#') continue;
      out_ << "> " << line << "\n";
      auto err = exec(tokenize(line));
      if (!err.empty()) out_ << "  error: " << err << "\n";
    }
    return out_.str();
  }

 private:
  std::string exec(const std::vector<std::string>& t) {
    const std::string& cmd = t[0];
    if (cmd == "node") {
      auto o = options(t, 2);
      testing::NodeBuilder b(t[1]);
      model::CudaVersion cuda = model::CudaVersion::parse(o.count("cuda") ? o["cuda"] : "12.4").value();
      b.gpus(std::stoi(o["gpus"]), o["product"], o.count("memory") ? std::stoll(o["memory"]) : 81920,
             o.count("driver") ? o["driver"] : "550.54.15", cuda);
      if (o.count("nvlink")) {
        auto dash = o["nvlink"].find('-');
        int first = std::stoi(o["nvlink"].substr(0, dash));
        int last = std::stoi(o["nvlink"].substr(dash + 1));
        b.nvlink(first, last - first + 1);
      }
      b.address(o.count("address") ? o["address"] : "10.0.0." + std::to_string(++hosts_));
      if (o.count("ports")) {
        auto dash = o["ports"].find('-');
        b.ports(std::stoi(o["ports"].substr(0, dash)), std::stoi(o["ports"].substr(dash + 1)));
      }
      if (o.count("state")) b.state(*model::parse_node_state(o["state"]));
      return print(s_.update_node(b.build(), now_));
    }
    if (cmd == "submit") {
      model::JobId id = std::stoll(t[1]);
      auto o = options(t, 2);
      testing::JobBuilder b;
      if (o.count("gpus")) {
        b.total(std::stoi(o["gpus"]));
      } else {
        b.nodes(o.count("nodes") ? std::stoi(o["nodes"]) : 1, std::stoi(o["gpus_per_node"]));
      }
      if (o.count("model")) b.model(o["model"]);
      if (o.count("priority")) b.priority(std::stoi(o["priority"]));
      if (o.count("retries")) b.retries(std::stoi(o["retries"]));
      if (o.count("limit")) b.limit(parse_duration(o["limit"]).value());
      model::JobSpec spec = b;
      if (auto ok = s_.admissible(spec); !ok) return "rejected: " + ok.error().message();
      auto r = s_.add_pending(id, o.count("user") ? o["user"] : "alice", spec, now_);
      return r ? "" : r.error().message();
    }
    if (cmd == "time") {
      now_ += parse_duration(t[1].substr(1)).value();
      return "";
    }
    if (cmd == "schedule") {
      print(s_.schedule(now_));
      return "";
    }
    if (cmd == "event") {
      model::JobId id = std::stoll(t[1]);
      const SchedJob* j = s_.job(id);
      if (!j) return "no live job " + t[1];
      auto o = options(t, 3);
      EventInfo info;
      if (o.count("rank")) info.rank = std::stoi(o["rank"]);
      if (o.count("node")) info.node = o["node"];
      if (o.count("code")) info.exit_code = std::stoi(o["code"]);
      static const std::map<std::string, JobEvent> kEvents = {
          {"started", JobEvent::AllRanksStarted}, {"exited-ok", JobEvent::AllRanksExitedOk},
          {"failed", JobEvent::RankFailed},       {"launch-failed", JobEvent::LaunchFailed},
          {"port-busy", JobEvent::PortBusy},      {"cancel", JobEvent::Cancel},
          {"gone", JobEvent::RanksGone}};
      auto e = kEvents.find(t[2]);
      if (e == kEvents.end()) return "unknown event " + t[2];
      return print(s_.on_event(id, j->attempt, e->second, now_, info));
    }
    if (cmd == "node-state") {
      return print(s_.set_node_state(t[1], *model::parse_node_state(t[2]), t.size() > 3 ? t[3] : "", now_));
    }
    if (cmd == "queue") {
      std::vector<model::JobId> ids;
      for (model::JobId id = 1; id < 1000; ++id) {
        if (s_.job(id)) ids.push_back(id);
      }
      for (auto id : ids) {
        const SchedJob* j = s_.job(id);
        out_ << "  job " << id << " " << model::to_string(j->state);
        if (j->state == JobState::Pending) out_ << " " << to_string(j->reason.code) << ": " << j->reason.detail;
        out_ << "\n";
      }
      return "";
    }
    return "unknown command " + cmd;
  }

  std::string print(const Result<std::vector<Decision>>& r) {
    if (!r) return r.error().message();
    print(*r);
    return "";
  }

  void print(const std::vector<Decision>& ds) {
    for (const auto& d : ds) {
      if (const auto* c = std::get_if<JobChange>(&d)) {
        out_ << "  job " << c->job << ": " << c->text << "\n";
      } else if (const auto* k = std::get_if<KillRanks>(&d)) {
        out_ << "  kill job " << k->job << " attempt " << k->attempt << " on";
        for (const auto& n : k->nodes) out_ << " " << n;
        out_ << "\n";
      }
    }
  }

  Scheduler s_;
  Instant now_ = testing::at_seconds(1'700'000'000);
  int hosts_ = 0;
  std::ostringstream out_;
};

class GoldenScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenScenario, ProducesTheRecordedDecisions) {
  fs::path path = fs::path(CORRAL_SOURCE_DIR) / "tests/scenarios" / (GetParam() + ".scn");
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::vector<std::string> script;
  std::string expected;
  std::string line;
  bool in_expected = false;
  while (std::getline(in, line)) {
    if (!in_expected && line == "----") {
      in_expected = true;
      continue;
    }
    if (in_expected) {
      expected += line + "\n";
    } else {
      script.push_back(line);
    }
  }
  std::string actual = ScenarioRunner().run(script);
  if (std::getenv("CORRAL_UPDATE_GOLDEN") != nullptr) {
    std::ofstream outf(path);
    for (const auto& l : script) outf << l << "\n";
    outf << "----\n" << actual;
    GTEST_SKIP() << "rewrote " << path;
  }
  EXPECT_EQ(actual, expected);
}

std::vector<std::string> scenario_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(CORRAL_SOURCE_DIR) / "tests/scenarios")) {
    if (e.path().extension() == ".scn") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, GoldenScenario, ::testing::ValuesIn(scenario_names()),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace corral::sched
