#include "worker/rendezvous_wire.hpp"

#include <gtest/gtest.h>

namespace corral::worker {
namespace {

std::string without_newline(std::string line) {
  EXPECT_EQ(line.back(), '\n');
  line.pop_back();
  return line;
}

TEST(RendezvousWire, HelloRoundTrips) {
  Hello h{3, 4, "fe80::1%eth0", 29500, 42, 1, 4};
  std::string line = format_hello(h);
  EXPECT_EQ(line,
            "corral-tcp-check/1 rank=3 world_size=4 master_addr=fe80::1%eth0 master_port=29500 job=42 "
            "attempt=1 value=4\n");
  auto parsed = parse_hello(without_newline(line));
  ASSERT_TRUE(parsed.has_value()) << parsed.error().message();
  EXPECT_EQ(parsed->rank, 3);
  EXPECT_EQ(parsed->world_size, 4);
  EXPECT_EQ(parsed->master_addr, "fe80::1%eth0");
  EXPECT_EQ(parsed->master_port, 29500);
  EXPECT_EQ(parsed->job_id, 42);
  EXPECT_EQ(parsed->attempt, 1);
  EXPECT_EQ(parsed->value, 4);
}

TEST(RendezvousWire, RefusesSomethingThatIsNotAHello) {
  EXPECT_EQ(parse_hello("GET / HTTP/1.1\r").error().message(),
            "not a corral tcp-check hello: it starts \"GET / HTTP/1.1\\x0d\"");
  EXPECT_EQ(parse_hello("corral-tcp-check/2 rank=1").error().message(),
            "hello speaks \"corral-tcp-check/2\", this worker speaks corral-tcp-check/1");
}

TEST(RendezvousWire, RefusesAHelloWithoutEveryField) {
  EXPECT_EQ(parse_hello("corral-tcp-check/1 rank=1 world_size=2").error().message(),
            "hello lacks master_addr");
  EXPECT_EQ(parse_hello("corral-tcp-check/1 rank=1 rank=2").error().message(), "hello repeats \"rank\"");
  EXPECT_EQ(parse_hello(
                "corral-tcp-check/1 rank=x world_size=2 master_addr=a master_port=1 job=1 attempt=0 value=1")
                .error()
                .message(),
            "field rank=\"x\" is not a number");
}

TEST(RendezvousWire, RefusesAnOverlongLine) {
  EXPECT_FALSE(parse_hello(std::string(kWireMagic) + " " + std::string(kMaxLineBytes, 'a')).has_value());
}

TEST(RendezvousWire, RepliesRoundTrip) {
  auto ok = parse_reply(without_newline(format_reply({Reply::Kind::Ok, 10, {}})));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->kind, Reply::Kind::Ok);
  EXPECT_EQ(ok->sum, 10);
  auto refused = parse_reply(without_newline(format_reply({Reply::Kind::Refused, 0, "two\njobs"})));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->kind, Reply::Kind::Refused);
  EXPECT_EQ(refused->message, "two jobs");
  auto timeout = parse_reply(without_newline(format_reply({Reply::Kind::TimedOut, 0, "waited"})));
  ASSERT_TRUE(timeout.has_value());
  EXPECT_EQ(timeout->kind, Reply::Kind::TimedOut);
}

TEST(RendezvousWire, CutsAReplyMessageToOneLine) {
  std::string line = format_reply({Reply::Kind::Refused, 0, std::string(5000, 'x')});
  EXPECT_EQ(line.size(), kMaxLineBytes);
  EXPECT_TRUE(parse_reply(without_newline(line)).has_value());
}

}  // namespace
}  // namespace corral::worker
