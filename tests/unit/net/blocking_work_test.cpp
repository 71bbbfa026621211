// BlockingWork with a real EventLoop: work runs off the loop thread, results come back
// on it, and the loop keeps serving timers while work blocks.

#include "common/net/blocking_work.hpp"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "common/net/event_loop.hpp"

namespace corral::net {
namespace {

using namespace std::chrono_literals;

TEST(BlockingWork, RunsWorkOffTheLoopAndHandsTheResultBackOnIt) {
  EventLoop loop;
  BlockingWork work(loop, 2, "test-work");
  const auto loop_thread = std::this_thread::get_id();
  std::thread::id worked_on;
  std::thread::id done_on;
  int result = 0;
  work.run(
      [&worked_on] {
        worked_on = std::this_thread::get_id();
        return 42;
      },
      [&](int r) {
        done_on = std::this_thread::get_id();
        result = r;
        loop.stop();
      });
  loop.run();
  EXPECT_EQ(result, 42);
  EXPECT_NE(worked_on, loop_thread);
  EXPECT_EQ(done_on, loop_thread);
  EXPECT_EQ(work.pending(), 0u);
}

TEST(BlockingWork, TheLoopKeepsItsTimersWhileWorkBlocks) {
  EventLoop loop;
  BlockingWork work(loop, 1, "test-work");
  // The work blocks until a timer on the loop releases it: were the loop waiting for
  // the work, neither could go on.
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  int ticks = 0;
  bool done = false;
  work.run([released] { released.wait(); }, [&] {
    done = true;
    loop.stop();
  });
  Timer timer(loop);
  timer.start_repeating(5ms, [&] {
    if (++ticks == 3) release->set_value();
  });
  Timer guard(loop);
  guard.start(10s, [&] { loop.stop(); });
  loop.run();
  EXPECT_TRUE(done);
  EXPECT_GE(ticks, 3);
}

TEST(BlockingWork, ResultsAfterItIsDestroyedAreDropped) {
  EventLoop loop;
  bool called = false;
  std::promise<void> started;
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  {
    BlockingWork work(loop, 1, "test-work");
    work.run(
        [&started, released] {
          started.set_value();
          released.wait();
        },
        [&called] { called = true; });
    started.get_future().wait();
  }
  release->set_value();
  // Whatever the detached thread may still post runs now, and must not call back.
  Timer timer(loop);
  timer.start(100ms, [&] { loop.stop(); });
  loop.run();
  EXPECT_FALSE(called);
}

// Two tasks given at once while one thread idles: the second must not wait behind the
// first, which here blocks until the second has run (as an nvidia-smi that does not
// answer would hold up whatever queued behind it).
TEST(BlockingWork, TwoTasksGivenAtOnceToOneIdleThreadRunSideBySide) {
  EventLoop loop;
  BlockingWork work(loop, 4, "test-work");
  work.run([] {}, [&] { loop.stop(); });  // one thread, idle from now on
  loop.run();
  std::promise<void> second_ran;
  auto ran = second_ran.get_future().share();
  bool first_saw_it = false;
  int done = 0;
  work.run([ran] { return ran.wait_for(5s) == std::future_status::ready; },
           [&](bool saw) {
             first_saw_it = saw;
             if (++done == 2) loop.stop();
           });
  work.run([&second_ran] { second_ran.set_value(); }, [&] {
    if (++done == 2) loop.stop();
  });
  loop.run();
  EXPECT_TRUE(first_saw_it) << "the second task waited behind the first";
}

TEST(BlockingWork, RunsNoMoreThanItsThreadsAtOnce) {
  EventLoop loop;
  BlockingWork work(loop, 2, "test-work");
  std::atomic<int> now{0};
  std::atomic<int> most{0};
  int finished = 0;
  for (int i = 0; i < 8; ++i) {
    work.run(
        [&] {
          int n = ++now;
          int seen = most.load();
          while (n > seen && !most.compare_exchange_weak(seen, n)) {
          }
          std::this_thread::sleep_for(2ms);  // overlap, if more than two ran
          --now;
        },
        [&] {
          if (++finished == 8) loop.stop();
        });
  }
  loop.run();
  EXPECT_EQ(finished, 8);
  EXPECT_LE(most.load(), 2);
}

}  // namespace
}  // namespace corral::net
