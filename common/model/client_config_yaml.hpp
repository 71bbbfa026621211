#pragma once
// The CLI's connection settings file (~/.config/corral/config.yaml) as a plain value.
// yaml-cpp stays inside the .cpp.
//
//   url: https://coordinator.lab:7433
//   token: 3f9c...
//   ca: ca.pem            # relative to the file's folder (the loader resolves it)

#include <cstddef>
#include <string>
#include <string_view>

#include "common/core/error.hpp"

namespace corral::model {

// Each field is empty when the file does not set it: the environment may supply it.
struct ClientConfig {
  std::string url;    // https://host:port
  std::string token;  // bearer token
  std::string ca;     // the cluster CA certificate, as written in the file

  bool operator==(const ClientConfig&) const = default;
};

inline constexpr std::size_t kMaxClientConfigBytes = 64 * 1024;

// Never throws. InvalidArgument listing every problem, one per line, each
// "file:line:col: key: message"; unknown keys are refused (with a suggestion when one
// looks like a typo), as are keys set twice. An empty file is an empty config.
[[nodiscard]] Result<ClientConfig> parse_client_config(std::string_view yaml, std::string_view file_name);

}  // namespace corral::model
