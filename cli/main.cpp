// corral: the command-line tool for people. Parses and dispatches (cli/app.cpp); the
// real streams, environment, clock and HTTPS client are wired in here.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cli/app.hpp"
#include "cli/keeper.hpp"
#include "common/net/http_client.hpp"

namespace {

std::atomic<int> g_interrupts{0};

void on_sigint(int) { g_interrupts.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

int main(int argc, char** argv) {
  using namespace corral;
  net::skip_tls_teardown_at_exit();
  std::vector<std::string> args(argv + 1, argv + argc);
  // The connection keeper (cli/keeper.hpp), started by corral itself: not a command.
  if (!args.empty() && args.front() == "keep-connection") return cli::run_keeper(args, std::cerr);
  SystemClock clock;
  cli::AppContext ctx{std::cout,
                      std::cerr,
                      cli::process_environment(),
                      clock,
                      [](Duration d) { std::this_thread::sleep_for(d); },
                      [](cli::HttpApiClient::SettingsSource settings) -> std::unique_ptr<cli::ApiClient> {
                        return std::make_unique<cli::HttpApiClient>(std::move(settings), std::chrono::seconds(30),
                                                                    cli::keeper_use(cli::process_environment()));
                      }};
  std::error_code ec;
  ctx.cwd = std::filesystem::current_path(ec).string();
  ctx.in = &std::cin;
  ctx.err_is_tty = ::isatty(STDERR_FILENO) == 1;
  // `corral run` turns Ctrl-C into a cancel (or a detach); every other command keeps the
  // default, so Ctrl-C ends it at once.
  if (!args.empty() && args.front() == "run") {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ctx.interrupts = [] { return g_interrupts.load(std::memory_order_relaxed); };
  }
  for (char** e = ::environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) ctx.environ.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  int code = cli::run_app(args, ctx);
  std::cout.flush();
  return code;
}
