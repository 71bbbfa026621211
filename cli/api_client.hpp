#pragma once
// ApiClient: the coordinator's HTTP API (docs/api.md) as the commands see it, one call at
// a time on the calling thread. HttpApiClient is the real one; tests hand in a fake.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/connection.hpp"
#include "cli/keeper.hpp"
#include "common/core/error.hpp"
#include "common/core/time.hpp"

namespace corral::net {
class HttpClient;
struct HttpResponse;
}

namespace corral::cli {

struct ApiResponse {
  int status = 0;
  std::string body;
};

// Request headers beyond the token, e.g. {"Idempotency-Key", KEY}.
using ApiHeaders = std::vector<std::pair<std::string, std::string>>;

// The header that makes a submission safe to send again (docs/api.md).
inline constexpr const char* kIdempotencyKeyHeader = "Idempotency-Key";

// A fresh random key for one submission: 128 bits as 32 lowercase hex characters.
std::string new_idempotency_key();

class ApiClient {
 public:
  virtual ~ApiClient() = default;
  // An HTTP answer of any status, or a failure to get one: Unavailable or Timeout when
  // the coordinator cannot be reached (TLS failures included), InvalidArgument when the
  // connection settings are missing or unusable.
  virtual Result<ApiResponse> call(const std::string& method, const std::string& target,
                                   const std::string& body = {}, const ApiHeaders& headers = {}) = 0;
};

// Resolves its settings and connects on the first call, so that commands which fail
// before talking to the coordinator (a spec that does not validate) need no config.
// Keeps one kept-alive connection; not thread-safe. With a `keeper` folder, an https URL
// is reached through the user's connection keeper (keeper.hpp) when one is running, and
// one is started once the coordinator has answered directly when none is.
class HttpApiClient final : public ApiClient {
 public:
  using SettingsSource = std::function<Result<ConnectionSettings>()>;

  explicit HttpApiClient(SettingsSource settings, Duration timeout = std::chrono::seconds(30), KeeperUse keeper = {});
  ~HttpApiClient() override;
  HttpApiClient(const HttpApiClient&) = delete;
  HttpApiClient& operator=(const HttpApiClient&) = delete;

  // A request that carries an Idempotency-Key is sent again, directly, when it may have
  // reached the coordinator but no answer came (the connection or the keeper died, the
  // coordinator restarted): after each of kRetryDelays, a refused connection included
  // once it may have been seen. The coordinator answers a repeat with what the first made.
  static constexpr Duration kRetryDelays[] = {std::chrono::milliseconds(500), std::chrono::milliseconds(1500),
                                              std::chrono::milliseconds(3000)};
  Result<ApiResponse> call(const std::string& method, const std::string& target, const std::string& body = {},
                           const ApiHeaders& headers = {}) override;

 private:
  Result<void> connect(bool try_keeper);
  Result<net::HttpResponse> request(const std::string& method, const std::string& target, const std::string& body,
                                    const ApiHeaders& headers);
  Result<net::HttpResponse> send_again(const std::string& method, const std::string& target, const std::string& body,
                                       const ApiHeaders& headers, Result<net::HttpResponse> failed);

  SettingsSource settings_;
  Duration timeout_;
  KeeperUse keeper_;
  std::string token_;
  bool via_keeper_ = false;
  // Set when no keeper answered: one is started after the first answer from the coordinator.
  std::string keeper_to_start_;
  ConnectionSettings settings_used_;
  std::unique_ptr<net::HttpClient> http_;
  // After a failed request: the coordinator may have acted on it.
  bool maybe_seen_ = false;
};

// The Error for a non-2xx answer, from its {"error": "..."} body. The code decides the
// exit code (exit_codes.hpp): 401 Unauthenticated (3); 400 InvalidArgument (2: the
// coordinator refused what the user typed or wrote); 403 PermissionDenied with the
// message "not allowed: ..."; 404 NotFound; 409 Conflict; 413 and 422 ResourceExhausted;
// anything else Internal (all 1).
Error error_from_response(const ApiResponse& response);

}  // namespace corral::cli
