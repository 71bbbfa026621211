#pragma once
// EventLoop: the one thread a daemon's work runs on (an Asio io_context behind a pimpl,
// so no Asio header leaks out of common/net). Everything posted or timed runs on the
// thread that called run().

#include <functional>
#include <memory>

#include "common/core/time.hpp"

namespace corral::net {

class EventLoop;

// A one-shot or repeating timer; cancelled when destroyed. Lives on its loop's thread.
class Timer {
 public:
  explicit Timer(EventLoop& loop);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Calls fn once after `delay`; replaces any pending call.
  void start(Duration delay, std::function<void()> fn);
  // Calls fn every `period` until cancelled.
  void start_repeating(Duration period, std::function<void()> fn);
  void cancel();

 struct Impl;  // public so the .cpp's helpers can name it

 private:
  std::shared_ptr<Impl> impl_;
};

class EventLoop {
 public:
  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Runs until stop() or until no work is left.
  void run();
  // Runs handlers that are ready, without blocking; returns how many ran.
  std::size_t poll();
  void stop();
  bool stopped() const;
  // Runs fn on the loop's thread, after the handlers already ready. Thread-safe.
  void post(std::function<void()> fn);
  // Calls fn on the loop thread when SIGINT or SIGTERM arrives.
  void on_shutdown_signal(std::function<void(int)> fn);
  // Calls fn on the loop thread each time `signal` arrives (e.g. SIGCHLD).
  void on_signal(int signal, std::function<void()> fn);

  // For common/net's own classes: the io_context behind the loop.
  void* native();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace corral::net
