#pragma once
// BlockingWork: runs what may block (external commands, reads of /proc, user lookups,
// waits on a child) on its own threads and hands each result back to the loop's thread,
// so that the loop never waits. The work runs on a worker thread and may only use what
// it captured by value; `done` runs on the loop thread, and never after the BlockingWork
// is destroyed (a result that arrives later is dropped). Work still running at
// destruction is left to finish on its own (a command bounded by its timeout).

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace corral::net {

class EventLoop;

class BlockingWork {
 public:
  // `threads` bounds how much runs at once; more work waits its turn.
  BlockingWork(EventLoop& loop, std::size_t threads, std::string name);
  ~BlockingWork();
  BlockingWork(const BlockingWork&) = delete;
  BlockingWork& operator=(const BlockingWork&) = delete;

  template <class Work, class Done>
  void run(Work work, Done done) {
    using T = std::invoke_result_t<Work&>;
    if constexpr (std::is_void_v<T>) {
      submit([work = std::move(work), done = std::move(done)]() mutable -> std::function<void()> {
        work();
        return std::move(done);
      });
    } else {
      submit([work = std::move(work), done = std::move(done)]() mutable -> std::function<void()> {
        auto result = std::make_shared<T>(work());
        return [done = std::move(done), result]() mutable { done(std::move(*result)); };
      });
    }
  }

  // Work queued or running now.
  std::size_t pending() const;

  struct State;  // public so the .cpp's helpers can name it

 private:
  // Runs `task` on a worker thread; what it returns is then posted to the loop.
  void submit(std::function<std::function<void()>()> task);

  std::shared_ptr<State> state_;
};

}  // namespace corral::net
