#include "common/net/event_loop.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <csignal>
#include <optional>
#include <vector>

#include "common/net/asio_access.hpp"

namespace corral::net {

namespace asio = boost::asio;

// One signal set and what to do when it fires. The loop owns it, so the pending wait
// refers to it by pointer: a handler holding itself would never be freed.
struct SignalWatch {
  SignalWatch(asio::io_context& io, std::function<void(int)> on_signal) : set(io), fn(std::move(on_signal)) {}
  void arm() {
    set.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      fn(sig);
      arm();
    });
  }
  asio::signal_set set;
  std::function<void(int)> fn;
};

struct EventLoop::Impl {
  asio::io_context io{1};
  // Destroyed before io: their pending waits end aborted, never called.
  std::vector<std::unique_ptr<SignalWatch>> watches;
};

EventLoop::EventLoop() : impl_(std::make_unique<Impl>()) {}
EventLoop::~EventLoop() = default;

void EventLoop::run() {
  if (impl_->io.stopped()) impl_->io.restart();
  auto guard = asio::make_work_guard(impl_->io);
  impl_->io.run();
}

std::size_t EventLoop::poll() {
  if (impl_->io.stopped()) impl_->io.restart();
  return impl_->io.poll();
}

void EventLoop::stop() { impl_->io.stop(); }
bool EventLoop::stopped() const { return impl_->io.stopped(); }

void* EventLoop::native() { return &impl_->io; }

void EventLoop::post(std::function<void()> fn) { asio::post(impl_->io, std::move(fn)); }

void EventLoop::on_shutdown_signal(std::function<void(int)> fn) {
  auto& watch = impl_->watches.emplace_back(std::make_unique<SignalWatch>(impl_->io, std::move(fn)));
  watch->set.add(SIGINT);
  watch->set.add(SIGTERM);
  watch->arm();
}

void EventLoop::on_signal(int signal, std::function<void()> fn) {
  auto& watch = impl_->watches.emplace_back(
      std::make_unique<SignalWatch>(impl_->io, [fn = std::move(fn)](int) { fn(); }));
  watch->set.add(signal);
  watch->arm();
}

struct Timer::Impl {
  explicit Impl(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
  std::uint64_t generation = 0;
};

namespace {

void arm(const std::shared_ptr<Timer::Impl>& impl, Duration delay, std::optional<Duration> period,
         std::shared_ptr<std::function<void()>> fn) {
  std::uint64_t gen = impl->generation;
  impl->timer.expires_after(delay);
  std::weak_ptr<Timer::Impl> weak = impl;
  impl->timer.async_wait([weak, gen, period, fn](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->generation != gen) return;
    // Re-arm before calling: fn may cancel or restart the timer.
    if (period) arm(self, *period, period, fn);
    (*fn)();
  });
}

}  // namespace

Timer::Timer(EventLoop& loop) : impl_(std::make_shared<Impl>(io_of(loop))) {}
Timer::~Timer() { cancel(); }

void Timer::cancel() {
  ++impl_->generation;
  impl_->timer.cancel();
}

void Timer::start(Duration delay, std::function<void()> fn) {
  cancel();
  arm(impl_, delay, std::nullopt, std::make_shared<std::function<void()>>(std::move(fn)));
}

void Timer::start_repeating(Duration period, std::function<void()> fn) {
  cancel();
  arm(impl_, period, period, std::make_shared<std::function<void()>>(std::move(fn)));
}

}  // namespace corral::net
