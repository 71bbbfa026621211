#include <climits>
#include <cstdio>
#include <optional>

#include <unistd.h>

#include "common/core/strings.hpp"
#include "worker/commands.hpp"
#include "worker/exit_codes.hpp"
#include "worker/flags.hpp"
#include "worker/json_line.hpp"
#include "worker/rank_env.hpp"
#include "worker/tcp_rendezvous.hpp"

namespace corral::worker {

namespace {

constexpr std::string_view kKnownFlags[] = {"timeout", "gpus-per-rank"};

ExitCode exit_code_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::Timeout:
      return ExitCode::RendezvousTimeout;
    case ErrorCode::Conflict:
      return ExitCode::PeerMismatch;
    case ErrorCode::Unavailable:
      return ExitCode::PortUnavailable;
    default:
      return ExitCode::NetworkError;
  }
}

// Everything a rank knows about itself, for the JSON line whether or not it failed.
void add_env_fields(JsonLine& json, const RankEnv& env) {
  json.add("rank", env.rank)
      .add("world_size", env.world_size)
      .add("local_rank", env.local_rank)
      .add("node_rank", env.node_rank)
      .add("master_addr", env.master_addr)
      .add("master_port", env.master_port)
      .add("job_id", env.job_id)
      .add("attempt", env.attempt)
      .add("hostname", host_name())
      .add("cuda_visible_devices", env.cuda_visible_devices);
}

// `rank` is known whenever RANK is readable, even if the rest of the environment is not.
int fail(ExitCode code, std::optional<std::int64_t> rank, const RankEnv* env, const std::string& message) {
  std::string who = rank ? "tcp-check: rank " + std::to_string(*rank) + ": " : "tcp-check: ";
  JsonLine json;
  json.add("check", "tcp");
  if (env != nullptr) {
    add_env_fields(json, *env);
  } else if (rank) {
    json.add("rank", *rank);
  } else {
    json.add_null("rank");
  }
  return print_result(json, who, Failure{code, message});
}

std::optional<std::int64_t> readable_rank(const EnvMap& env) {
  auto it = env.find(std::string_view("RANK"));
  if (it == env.end()) return std::nullopt;
  auto rank = parse_integer("RANK", it->second, 0, INT_MAX);
  return rank ? std::optional(*rank) : std::nullopt;
}

}  // namespace

int run_tcp_check(std::span<const std::string> args) {
  auto flags = parse_flags(args, kKnownFlags);
  if (!flags) return fail(ExitCode::Usage, std::nullopt, nullptr, flags.error().message());
  RendezvousOptions options;
  RankEnvOptions env_options;
  if (auto it = flags->find("timeout"); it != flags->end()) {
    auto timeout = parse_timeout("timeout", it->second);
    if (!timeout) return fail(ExitCode::Usage, std::nullopt, nullptr, timeout.error().message());
    options.timeout = *timeout;
  }
  if (auto it = flags->find("gpus-per-rank"); it != flags->end()) {
    auto n = parse_integer("gpus-per-rank", it->second, 0, 1024);
    if (!n) return fail(ExitCode::Usage, std::nullopt, nullptr, n.error().message());
    env_options.gpus_per_rank = static_cast<int>(*n);
  }

  EnvMap process_env = read_process_env();
  auto env = parse_rank_env(process_env, env_options);
  if (!env) return fail(ExitCode::BadEnvironment, readable_rank(process_env), nullptr, env.error().message());

  options.log = [rank = env->rank](std::string_view line) {
    std::fprintf(stderr, "tcp-check: rank %d: %.*s\n", rank, static_cast<int>(line.size()), line.data());
  };
  // Each rank adds rank + 1, so the sum proves every rank was counted exactly once.
  auto result = run_tcp_rendezvous(*env, std::int64_t{env->rank} + 1, options);
  if (!result) return fail(exit_code_for(result.error().code()), env->rank, &*env, result.error().message());

  JsonLine json;
  json.add("check", "tcp");
  add_env_fields(json, *env);
  json.add("sum", result->sum);
  return print_result(json, "tcp-check: ", std::nullopt);
}

}  // namespace corral::worker
