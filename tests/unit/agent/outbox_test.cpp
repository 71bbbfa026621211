#include "agent/outbox.hpp"

#include <gtest/gtest.h>

namespace corral::agent {
namespace {

std::vector<std::string> all(std::deque<std::string> d) { return {d.begin(), d.end()}; }

TEST(Outbox, AReportIsKeptUntilItsConnectionAcknowledgesIt) {
  Outbox box;
  box.sent("a");
  box.sent("b");
  box.sent("c");
  box.acknowledged(2);
  EXPECT_EQ(box.unacknowledged(), 1u);
  box.acknowledged(2);  // the same count again changes nothing
  EXPECT_EQ(box.unacknowledged(), 1u);
  EXPECT_EQ(box.settled(), 2u);
  box.acknowledged(3);
  EXPECT_EQ(box.unacknowledged(), 0u);
  EXPECT_EQ(box.made(), 3u);
  EXPECT_EQ(box.settled(), 3u);
}

TEST(Outbox, WhatADroppedLinkDidNotAcknowledgeGoesOutFirstOnTheNext) {
  Outbox box;
  box.sent("started 0");
  box.sent("started 1");
  box.acknowledged(1);
  box.link_lost();
  box.hold("exited 0");  // while no link is up
  EXPECT_EQ(all(box.release()), (std::vector<std::string>{"started 1", "exited 0"}));
  // Counted afresh on the new connection.
  box.acknowledged(1);
  EXPECT_EQ(box.unacknowledged(), 1u);
  EXPECT_EQ(box.settled(), 2u) << "only the first two reports made are acknowledged";
  box.link_lost();
  EXPECT_EQ(all(box.release()), (std::vector<std::string>{"exited 0"}));
  EXPECT_EQ(box.settled(), 2u);
  box.acknowledged(1);
  EXPECT_EQ(box.settled(), 3u);
}

TEST(Outbox, HoldsNoMoreThanItsBoundDroppingTheOldest) {
  Outbox box(2);
  box.hold("1");
  box.hold("2");
  box.hold("3");
  EXPECT_EQ(box.settled(), 1u) << "the dropped report needs nothing more from its maker";
  EXPECT_EQ(all(box.release()), (std::vector<std::string>{"2", "3"}));
  box.link_lost();
  box.hold("4");  // over the bound again: "2" goes
  EXPECT_EQ(box.made(), 4u);
  EXPECT_EQ(box.settled(), 2u);
}

// A report made while the link is closing (sent ones not yet given back by link_lost):
// over the bound the oldest goes, the sent one, so reports stay settled in order.
TEST(Outbox, OverTheBoundTheOldestGoesEvenWhenItWasSentOnALinkThatIsClosing) {
  Outbox box(2);
  box.sent("1");
  box.hold("2");
  box.hold("3");
  EXPECT_EQ(box.settled(), 1u);
  EXPECT_EQ(box.unacknowledged(), 0u);
  box.acknowledged(1);  // the coordinator had it after all: nothing more to settle
  EXPECT_EQ(box.settled(), 1u);
  EXPECT_EQ(all(box.release()), (std::vector<std::string>{"2", "3"}));
  box.acknowledged(3);
  EXPECT_EQ(box.settled(), 3u);
  EXPECT_EQ(box.made(), 3u);
}

}  // namespace
}  // namespace corral::agent
