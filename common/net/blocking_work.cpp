#include "common/net/blocking_work.hpp"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/net/event_loop.hpp"

namespace corral::net {

struct BlockingWork::State {
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::function<std::function<void()>()>> queue;
  EventLoop* loop = nullptr;  // null once the owner is gone: results are dropped
  std::size_t max_threads = 1;
  std::size_t threads = 0;
  std::size_t idle = 0;
  std::size_t pending = 0;    // queued or running
  std::string name;
  // Read and written on the loop thread only: a result posted before the owner was
  // destroyed and run after it is dropped.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
};

namespace {

void work_loop(const std::shared_ptr<BlockingWork::State>& state);

}  // namespace

BlockingWork::BlockingWork(EventLoop& loop, std::size_t threads, std::string name)
    : state_(std::make_shared<State>()) {
  state_->loop = &loop;
  state_->max_threads = threads == 0 ? 1 : threads;
  state_->name = std::move(name);
}

BlockingWork::~BlockingWork() {
  {
    std::lock_guard lock(state_->mutex);
    state_->loop = nullptr;
    state_->queue.clear();
    *state_->alive = false;
  }
  state_->wake.notify_all();
}

std::size_t BlockingWork::pending() const {
  std::lock_guard lock(state_->mutex);
  return state_->pending;
}

void BlockingWork::submit(std::function<std::function<void()>()> task) {
  bool start_thread = false;
  {
    std::lock_guard lock(state_->mutex);
    state_->queue.push_back(std::move(task));
    ++state_->pending;
    // A thread for each task no idle thread will take: an idle thread already woken for
    // an earlier task that it has not taken yet still counts as idle, so the queue, not
    // the idle count alone, says whether one more is needed (else two tasks given at once
    // to one idle thread run one after the other, the second behind a first that blocks).
    if (state_->queue.size() > state_->idle && state_->threads < state_->max_threads) {
      ++state_->threads;
      start_thread = true;
    }
  }
  if (start_thread) {
    // Detached: a thread still inside a command when the owner goes finishes it alone,
    // holding only the shared state.
    std::thread([state = state_] { work_loop(state); }).detach();
  } else {
    state_->wake.notify_one();
  }
}

namespace {

void work_loop(const std::shared_ptr<BlockingWork::State>& state) {
  ::pthread_setname_np(::pthread_self(), state->name.substr(0, 15).c_str());
  std::unique_lock lock(state->mutex);
  for (;;) {
    ++state->idle;
    state->wake.wait(lock, [&] { return state->loop == nullptr || !state->queue.empty(); });
    --state->idle;
    if (state->queue.empty()) break;  // the owner is gone
    auto task = std::move(state->queue.front());
    state->queue.pop_front();
    lock.unlock();
    std::function<void()> then = task();
    lock.lock();
    --state->pending;
    if (state->loop != nullptr && then) {
      state->loop->post([alive = state->alive, then = std::move(then)] {
        if (*alive) then();
      });
    }
  }
  --state->threads;
}

}  // namespace

}  // namespace corral::net
