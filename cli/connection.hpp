#pragma once
// Where the CLI finds its coordinator: ~/.config/corral/config.yaml (or --config FILE),
// with CORRAL_URL, CORRAL_TOKEN and CORRAL_CA overriding each key. The environment is
// passed in so tests need not touch the process's own.

#include <functional>
#include <optional>
#include <string>

#include "common/core/error.hpp"

namespace corral::cli {

struct ConnectionSettings {
  std::string url;    // https://host:port
  std::string token;  // bearer token
  std::string ca;     // path of the cluster CA certificate
  // Where the coordinator's latest TLS session ticket is kept between commands: the user's
  // config folder's tls-session (mode 0600); empty when HOME and XDG_CONFIG_HOME are unset.
  std::string session_file = {};

  bool operator==(const ConnectionSettings&) const = default;
};

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment.
EnvLookup process_environment();

// A variable's value, nullopt when unset or empty (an empty variable counts as unset).
std::optional<std::string> env_value(const EnvLookup& env, const std::string& name);

// $XDG_CONFIG_HOME/corral/config.yaml, else $HOME/.config/corral/config.yaml; empty when
// neither variable is set.
std::string default_config_path(const EnvLookup& env);

// The folder of default_config_path(env) (which need not exist), or empty.
std::string user_config_dir(const EnvLookup& env);

// Reads `config_file` (which must exist) or else the default file (which may be absent),
// then applies the environment over it; an empty variable counts as unset. A relative
// `ca` in a file is relative to that file's folder. InvalidArgument when a file cannot
// be read or is invalid, or when url, token or ca is set nowhere.
Result<ConnectionSettings> load_connection_settings(const std::optional<std::string>& config_file,
                                                    const EnvLookup& env);

}  // namespace corral::cli
