// nccl-root: creates a job's NCCL unique ID and hosts NCCL's bootstrap root for it.
// ncclGetUniqueId starts a thread with a listening socket in the calling process, and
// the ID is that socket's address plus a random magic, so this process must live until
// every rank has called ncclCommInitRank. The agent runs it as a child tied to the job
// and ends it by closing our stdin (or SIGTERM), which keeps NCCL's thread out of the
// agent (design.md, "NCCL unique IDs").

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "worker/commands.hpp"
#include "worker/exit_codes.hpp"
#include "worker/gpu/gpu_status.hpp"
#include "worker/hex.hpp"

namespace corral::worker {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "CORRAL_NCCL_UNIQUE_ID's length follows nccl.h");

namespace {

int fail(ExitCode code, const std::string& message) {
  std::fprintf(stderr, "nccl-root: %s\n", message.c_str());
  return to_int(code);
}

// Returns once stdin reaches EOF (or fails) or SIGTERM/SIGINT arrives on `signal_fd`.
void wait_for_the_end(int signal_fd) {
  pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signal_fd, POLLIN, 0}};
  char sink[4096];
  for (;;) {
    int rc = ::poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return;
    if (fds[1].revents != 0) return;
    if (fds[0].revents & (POLLNVAL | POLLERR)) return;
    if (fds[0].revents != 0) {
      // Whatever is written to stdin is ignored; only its end matters.
      ssize_t n = ::read(STDIN_FILENO, sink, sizeof(sink));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return;
    }
  }
}

}  // namespace

int run_nccl_root(std::span<const std::string> args) {
  if (!args.empty()) return fail(ExitCode::Usage, "takes no arguments");
  // Block the signals before NCCL starts its thread, which inherits the mask, so that
  // they reach signalfd instead of killing us by default or landing in NCCL's thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  if (::pthread_sigmask(SIG_BLOCK, &signals, nullptr) != 0)
    return fail(ExitCode::Internal, "cannot block signals");
  int signal_fd = ::signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd < 0) return fail(ExitCode::Internal, std::string("signalfd: ") + std::strerror(errno));

  ncclUniqueId id{};
  if (auto s = gpu::nccl_step(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s) {
    return fail(s.error().code, s.error().message);
  }
  std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(id.internal),
                                      sizeof(id.internal));
  std::string line = hex_encode(bytes) + "\n";
  if (std::fputs(line.c_str(), stdout) == EOF || std::fflush(stdout) != 0) {
    return fail(ExitCode::Internal, std::string("cannot write the ID to stdout: ") + std::strerror(errno));
  }

  wait_for_the_end(signal_fd);
  // NCCL's root thread may still sit in accept(); exiting without running static
  // destructors under its feet is the clean way to end it.
  std::fflush(nullptr);
  std::_Exit(to_int(ExitCode::Ok));
}

}  // namespace corral::worker
