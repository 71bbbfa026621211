// corral-worker: parses the subcommand and hands over; the commands live in corral::worker
// and worker/gpu.

#include <csignal>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/version.hpp"
#include "worker/commands.hpp"
#include "worker/exit_codes.hpp"

namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: corral-worker <command> [flags]\n"
               "  tcp-check [--timeout S] [--gpus-per-rank N]\n"
               "      check the rank environment, then a barrier and a sum all-reduce over TCP\n"
               "      at MASTER_ADDR:MASTER_PORT (rank 0 listens, the others connect)\n"
               "  nccl-root\n"
               "      print a new NCCL unique ID (256 hex characters) and host its bootstrap root\n"
               "      until stdin closes or SIGTERM/SIGINT\n"
               "  nccl-check [--timeout S] [--iters N] [--warmup N] [--max-bytes B]\n"
               "      all-reduce correctness and bandwidth with CORRAL_NCCL_UNIQUE_ID\n"
               "  preflight\n"
               "      every visible GPU: properties, an allocation and a small kernel\n"
               "Each command prints one JSON line; exit codes are listed in worker/README.md.\n"
               "This build %s the GPU commands.\n",
               corral::worker::built_with_gpu() ? "has" : "does NOT have");
}

}  // namespace

int main(int argc, char** argv) {
  using corral::worker::ExitCode;
  // Every socket write says MSG_NOSIGNAL; this covers stdout going away too, which should
  // be an error return, not a silent death.
  std::signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    usage(stderr);
    return corral::worker::to_int(ExitCode::Usage);
  }
  std::string_view command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "tcp-check") return corral::worker::run_tcp_check(args);
  if (command == "nccl-root") return corral::worker::run_nccl_root(args);
  if (command == "nccl-check") return corral::worker::run_nccl_check(args);
  if (command == "preflight") return corral::worker::run_preflight(args);
  if (command == "--version") {
    std::printf("%s\n", corral::version_line("corral-worker").c_str());
    return corral::worker::to_int(ExitCode::Ok);
  }
  if (command == "--help" || command == "-h" || command == "help") {
    usage(stdout);
    return corral::worker::to_int(ExitCode::Ok);
  }
  std::fprintf(stderr, "corral-worker: unknown command \"%.*s\"\n", static_cast<int>(command.size()),
               command.data());
  usage(stderr);
  return corral::worker::to_int(ExitCode::Usage);
}
