// corral: the command-line tool for people. Parses and dispatches (cli/app.cpp); the
// real streams, environment, clock and HTTPS client are wired in here.

#include <iostream>
#include <thread>

#include "cli/app.hpp"

int main(int argc, char** argv) {
  using namespace corral;
  std::vector<std::string> args(argv + 1, argv + argc);
  SystemClock clock;
  cli::AppContext ctx{std::cout,
                      std::cerr,
                      cli::process_environment(),
                      clock,
                      [](Duration d) { std::this_thread::sleep_for(d); },
                      [](cli::HttpApiClient::SettingsSource settings) -> std::unique_ptr<cli::ApiClient> {
                        return std::make_unique<cli::HttpApiClient>(std::move(settings));
                      }};
  int code = cli::run_app(args, ctx);
  std::cout.flush();
  return code;
}
