#include "common/protocol/codec.hpp"
#include "common/protocol/json_reader.hpp"

#include <gtest/gtest.h>

namespace corral::protocol {
namespace {

template <typename Msg>
void round_trip_agent(const Msg& m) {
  auto text = encode(AgentMessage(m));
  auto back = decode_agent_message(text);
  ASSERT_TRUE(back.has_value()) << back.error().message() << "\n" << text;
  ASSERT_TRUE(std::holds_alternative<Msg>(*back));
  EXPECT_EQ(std::get<Msg>(*back), m) << text;
}

template <typename Msg>
void round_trip_coordinator(const Msg& m) {
  auto text = encode(CoordinatorMessage(m));
  auto back = decode_coordinator_message(text);
  ASSERT_TRUE(back.has_value()) << back.error().message() << "\n" << text;
  ASSERT_TRUE(std::holds_alternative<Msg>(*back));
  EXPECT_EQ(std::get<Msg>(*back), m) << text;
}

TEST(Codec, EveryAgentMessageRoundTrips) {
  Hello h;
  h.node = "gpu-a";
  h.address = "10.0.0.11";
  h.ports = {29500, 29999};
  h.simulated = true;
  h.driver = "550.54.15";
  h.cuda = {12, 4};
  model::Gpu g;
  g.index = 3;
  g.uuid = "GPU-x";
  g.cls = {"NVIDIA A100-SXM4-80GB", 81920, "550.54.15"};
  g.cuda = {12, 4};
  g.nvlink_peers = {0, 1, 2};
  h.gpus = {g};
  h.running = {{7, 1, 0, 4242}};
  round_trip_agent(h);
  round_trip_agent(Heartbeat{});
  round_trip_agent(Synced{});
  round_trip_agent(AttemptGone{42, 3});
  round_trip_agent(Health{"nvidia-smi failed"});
  round_trip_agent(PrepareResult{7, 1, true, false, std::string(256, 'a'), "", 29500});
  round_trip_agent(RankStarted{7, 1, 3, 999});
  round_trip_agent(RankExited{7, 1, 3, 0, 9, "killed by signal 9", false});
  round_trip_agent(LogData{5, "line\n", 10, 15, true, "", 0, ""});
  round_trip_agent(LogData{5, "line\n", 10, 15, true, "", 4096, "the spool was full"});
  round_trip_agent(RankJoined{7, 1, 3});
  round_trip_agent(RankStall{7, 1, 3, true, 300000, "T (stopped)"});
  round_trip_agent(RankWarning{7, 1, 1, "pid 812 (python3) holds memory on GPU 0"});
  round_trip_agent(Stacks{9, {{3, "process 812 (python3) S (sleeping)\n"}, {2, ""}}});
  round_trip_agent(Inspection{7, 1, {{3, true, 812, "python3", "S (sleeping)", "hrtimer_nanosleep", 40, 2},
                                     {2, false, 0, "", "", "", 0, 0}}});
}

TEST(Codec, EveryCoordinatorMessageRoundTrips) {
  round_trip_coordinator(Welcome{1, 1000, 10000, ""});
  round_trip_coordinator(Reconcile{{{7, 1}, {8, 0}}});
  round_trip_coordinator(Prepare{7, 1, "10.0.0.11", 29500, true});
  Launch l;
  l.job = 7;
  l.attempt = 1;
  l.name = "ddp";
  l.user = "alice";
  l.command = {false, {"python3", "train.py"}};
  l.workdir = "/data";
  l.env = {{"NCCL_DEBUG", "INFO"}};
  l.nodes = {"gpu-a", "gpu-b"};
  l.world_size = 4;
  l.local_world_size = 2;
  l.master_addr = "10.0.0.11";
  l.master_port = 29500;
  l.ranks = {{0, 0, 0, {0}}, {1, 1, 0, {1}}};
  l.hang_timeout_ms = 600000;
  round_trip_coordinator(l);
  l.command = {true, {"echo hi"}};
  round_trip_coordinator(l);
  round_trip_coordinator(Kill{7, 1, 5000});
  round_trip_coordinator(LogRequest{9, 7, 1, 2, 100, 4096});
  round_trip_coordinator(Inspect{7, 1, {2, 3}});
  round_trip_coordinator(StackRequest{9, 7, 1, {3}});
}

TEST(Codec, RejectionsNameTheField) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"not json", "malformed JSON"},
      {"[]", "message: must be an object"},
      {R"({"type":"nope"})", "type: unknown message type nope"},
      {R"({"type":"rank_started","job":1,"attempt":0,"rank":-1,"pid":5})", "rank_started: rank: must be between 0 and 1048576"},
      {R"({"type":"rank_started","job":"1","attempt":0,"rank":0,"pid":5})", "rank_started: job: must be an integer"},
      {R"({"type":"rank_exited","job":1,"attempt":0,"rank":0,"exit_code":0})", "rank_exited: signal: required field is missing"},
      {R"({"type":"prepare_result","job":1,"attempt":0,"ok":true,"master_port":29500,"nccl_id":"xyz"})",
       "prepare_result: nccl_id: an NCCL unique ID has 256 hex characters, not 3"},
      {R"({"type":"hello","version":1,"node":"a","address":"x","ports":[2,1],"simulated":false,"cuda":"12.4","gpus":[],"running":[]})",
       "hello: ports: must be [first, last] with first <= last"},
      {R"({"type":"hello","version":1,"node":"a","address":"x","ports":[1,2],"simulated":false,"cuda":"12.4","gpus":[{"index":0}],"running":[]})",
       "hello: gpus[0].name: required field is missing"},
      {"{\"type\":\"hello\",\"version\":1,\"node\":\"a\",\"address\":\"10.0.0.1\\u001b[2J\",\"ports\":[1,2],"
       "\"simulated\":false,\"cuda\":\"12.4\",\"gpus\":[],\"running\":[]}",
       "hello: address: must be an IP address or a host name"},
      {R"({"type":"hello","version":1,"node":"a","address":"","ports":[1,2],"simulated":false,"cuda":"12.4","gpus":[],"running":[]})",
       "hello: address: must be an IP address or a host name"},
      {R"({"type":"rank_joined","job":1,"attempt":0})", "rank_joined: rank: required field is missing"},
      {R"({"type":"inspection","job":1,"attempt":0,"ranks":[{"rank":3,"alive":"yes","pid":1,"command":"x","state":"S","wchan":"","cpu_ms":0,"processes":1}]})",
       "inspection: ranks[0].alive: must be true or false"},
  };
  for (const auto& c : cases) {
    auto r = decode_agent_message(c.text);
    ASSERT_FALSE(r.has_value()) << c.text;
    EXPECT_EQ(r.error().message(), c.message) << c.text;
  }
  auto bad_launch = decode_coordinator_message(R"({"type":"launch","job":1,"attempt":0,"name":"x","user":"u","command":[],"nodes":[],"world_size":1,"local_world_size":1,"master_addr":"a","master_port":1,"ranks":[]})");
  ASSERT_FALSE(bad_launch.has_value());
  EXPECT_EQ(bad_launch.error().message(), "launch: command: must not be empty");
}

TEST(Codec, AMessageThatDoesNotDecodeCountsAsAReportUnlessItsTypeIsNone) {
  EXPECT_TRUE(counts_as_report(R"({"type":"rank_started","job":"x"})"));
  EXPECT_TRUE(counts_as_report("not json"));
  EXPECT_FALSE(counts_as_report(R"({"type":"stacks","request":1,"ranks":[{"rank":0,"report":7}]})"));
  EXPECT_FALSE(counts_as_report(R"({"type":"log_data"})"));
  EXPECT_FALSE(counts_as_report(R"({"type":"inspection","job":0})"));
}

TEST(Codec, TheHeartbeatAsEncodedIsKnownWithoutDecodingAndNothingElseIs) {
  EXPECT_TRUE(is_encoded_heartbeat(encode(AgentMessage{Heartbeat{}})));
  // Another spelling is a heartbeat too, but it goes through decoding like any message.
  EXPECT_FALSE(is_encoded_heartbeat(R"({ "type": "heartbeat" })"));
  auto spaced = decode_agent_message(R"({ "type": "heartbeat" })");
  ASSERT_TRUE(spaced.has_value());
  EXPECT_TRUE(std::holds_alternative<Heartbeat>(*spaced));
  EXPECT_FALSE(is_encoded_heartbeat(R"({"type":"heartbeat"} )"));
  EXPECT_FALSE(is_encoded_heartbeat(R"({"type":"health"})"));
  EXPECT_FALSE(is_encoded_heartbeat(""));
}

TEST(Codec, RefusesDeepNestingAndOversizedMessages) {
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_FALSE(decode_agent_message(deep).has_value());
  std::string big(kMaxMessageBytes + 1, ' ');
  auto r = decode_agent_message(big);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("the limit is"), std::string::npos);
}

TEST(Codec, JsonNestsAtMostThirtyTwoDeepAndBracketsInStringsDoNotCount) {
  auto nested = [](int levels, const std::string& inner) {
    return std::string(static_cast<std::size_t>(levels), '[') + inner + std::string(static_cast<std::size_t>(levels), ']');
  };
  EXPECT_TRUE(parse_json(nested(kMaxJsonDepth, "1"), 1 << 20).has_value());
  auto deep = parse_json(nested(kMaxJsonDepth + 1, "1"), 1 << 20);
  ASSERT_FALSE(deep.has_value());
  EXPECT_EQ(deep.error().message(), "JSON nested deeper than 32 levels");
  // Brackets and an escaped quote inside a string are text, not nesting.
  auto text = parse_json(nested(kMaxJsonDepth, R"("[[[{{{\"[[[")"), 1 << 20);
  ASSERT_TRUE(text.has_value());
  EXPECT_FALSE(parse_json(R"({"a": [1, 2})", 1 << 20).has_value());  // malformed still fails
}

TEST(Codec, LogBytesThatAreNotUtf8SurviveAsReplacements) {
  LogData d{1, std::string("ok\xff\xfe"), 0, 4, false, "", 0, ""};
  auto back = decode_agent_message(encode(AgentMessage(d)));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::get<LogData>(*back).data.substr(0, 2), "ok");
}

}  // namespace
}  // namespace corral::protocol
