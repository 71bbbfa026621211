#pragma once
// The `corral` command line: parses the arguments (CLI11, kept inside app.cpp), then
// runs one command. Everything from outside (streams, environment, clock, sleeping, the
// API client) comes in through AppContext, so tests drive it with fakes.

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "cli/api_client.hpp"
#include "cli/connection.hpp"
#include "common/core/time.hpp"
#include "common/model/submission.hpp"

namespace corral::cli {

struct AppContext {
  std::ostream& out;
  std::ostream& err;
  EnvLookup env;
  const Clock& clock;
  std::function<void(Duration)> sleep;
  // Makes the API client, given where its settings come from (resolved on first use).
  std::function<std::unique_ptr<ApiClient>(HttpApiClient::SettingsSource)> make_api;
  // What a submitted job takes along, as sbatch does: the working directory and the whole
  // environment (`--export` chooses which of it).
  std::string cwd = {};
  std::istream* in = nullptr;  // standard input (`corral submit -`)
  std::function<int()> interrupts = {};  // Ctrl-C presses so far
  bool err_is_tty = false;
  model::EnvList environ = {};
};

// `args` without the program name. Returns the exit code (exit_codes.hpp); usage
// errors, including every CLI11 parse error, are 2; --help is 0.
int run_app(const std::vector<std::string>& args, AppContext& ctx);

// "30" or "2.5" (seconds), or a duration like "90s", "30m", "1h30m".
Result<Duration> parse_timeout(const std::string& text);

}  // namespace corral::cli
