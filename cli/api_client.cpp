#include "cli/api_client.hpp"

#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <thread>

#include "common/core/hex.hpp"

#include "common/net/http_client.hpp"
#include "common/protocol/json_reader.hpp"

namespace corral::cli {

namespace {

bool same_header_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool carries_key(const ApiHeaders& headers) {
  return std::any_of(headers.begin(), headers.end(),
                     [](const auto& h) { return same_header_name(h.first, kIdempotencyKeyHeader); });
}

}  // namespace

std::string new_idempotency_key() {
  std::uint8_t bytes[16];
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::abort();  // no entropy: a guessable key could answer with someone's job
    got += static_cast<std::size_t>(n);
  }
  return hex_encode(bytes);
}

HttpApiClient::HttpApiClient(SettingsSource settings, Duration timeout, KeeperUse keeper)
    : settings_(std::move(settings)), timeout_(timeout), keeper_(std::move(keeper)) {}

HttpApiClient::~HttpApiClient() = default;

Result<void> HttpApiClient::connect(bool try_keeper) {
  auto settings = settings_();
  if (!settings) return std::unexpected(settings.error());
  token_ = settings->token;
  if (std::string socket = try_keeper ? keeper_socket(keeper_, *settings) : ""; !socket.empty()) {
    // A keeper that is not there (or not this user's) was never sent anything: go directly.
    // The keeper's own attempt ends first (at worst: a kept connection found closed, a new
    // connection and an exchange, each within `timeout_`), so that its answer, not this
    // process's deadline, says what went wrong.
    auto k = net::HttpClient::create("unix:" + socket, {}, 3 * timeout_ + std::chrono::seconds(5), /*peer_is_me=*/true);
    if (k && (*k)->connect()) {
      http_ = std::move(*k);
      via_keeper_ = true;
      return {};
    }
    if (keeper_.may_start) keeper_to_start_ = socket;
  }
  // create() fails on a malformed URL or an unreadable CA file: both are settings to fix,
  // hence InvalidArgument (exit 2), not a connection failure.
  auto http = net::HttpClient::create(
      settings->url, net::ClientTls{.ca = settings->ca, .cert = "", .key = "", .session_file = settings->session_file},
      timeout_);
  if (!http) return make_error(ErrorCode::InvalidArgument, http.error().message());
  http_ = std::move(*http);
  settings_used_ = std::move(*settings);
  return {};
}

Result<net::HttpResponse> HttpApiClient::request(const std::string& method, const std::string& target,
                                                 const std::string& body, const ApiHeaders& extra) {
  maybe_seen_ = false;
  if (!http_) {
    if (auto c = connect(/*try_keeper=*/true); !c) return std::unexpected(c.error());
  }
  ApiHeaders headers{{"Authorization", "Bearer " + token_}};
  headers.insert(headers.end(), extra.begin(), extra.end());
  auto r = http_->request(method, target, body, headers);
  if (!r && !via_keeper_) maybe_seen_ = !http_->last_request_unsent();
  if (r && via_keeper_) {
    // The keeper's own failure to reach the coordinator is this command's failure, as if
    // it had gone directly: the keeper's error code, the coordinator's message.
    for (const auto& [name, value] : r->headers) {
      if (!same_header_name(name, kKeeperErrorHeader)) continue;
      ErrorCode code = ErrorCode::Unavailable;
      for (ErrorCode c : {ErrorCode::Timeout, ErrorCode::InvalidArgument}) {
        if (value == to_string(c)) code = c;
      }
      // It may have reached the coordinator before the keeper lost it.
      maybe_seen_ = true;
      return make_error(code, error_from_response(ApiResponse{r->status, std::move(r->body)}).message());
    }
  }
  if (r || !via_keeper_) return r;
  // The keeper ended (or was killed) without answering: this and every later call go
  // directly. Sent again only when the coordinator cannot have seen it through the keeper.
  bool unsent = http_->last_request_unsent();
  http_.reset();
  via_keeper_ = false;
  if (!unsent && method != "GET") {
    maybe_seen_ = true;
    if (r.error().code() == ErrorCode::Timeout) {
      return make_error(ErrorCode::Timeout, "no answer through the connection keeper (" + r.error().message() +
                                                "); the request may have reached the coordinator");
    }
    return make_error(ErrorCode::Unavailable, "the connection keeper ended before answering (" + r.error().message() +
                                                  "); the request may have reached the coordinator");
  }
  if (auto c = connect(/*try_keeper=*/false); !c) return std::unexpected(c.error());
  r = http_->request(method, target, body, headers);
  if (!r) maybe_seen_ = !http_->last_request_unsent();
  return r;
}

Result<net::HttpResponse> HttpApiClient::send_again(const std::string& method, const std::string& target,
                                                    const std::string& body, const ApiHeaders& extra,
                                                    Result<net::HttpResponse> failed) {
  int tries = 1;
  for (Duration delay : kRetryDelays) {
    if (failed || !maybe_seen_ || failed.error().code() == ErrorCode::InvalidArgument) break;
    std::this_thread::sleep_for(delay);
    // Directly: a keeper that lost the request has ended, or is about to.
    http_.reset();
    via_keeper_ = false;
    if (auto c = connect(/*try_keeper=*/false); !c) return std::unexpected(c.error());
    ApiHeaders headers{{"Authorization", "Bearer " + token_}};
    headers.insert(headers.end(), extra.begin(), extra.end());
    failed = http_->request(method, target, body, headers);
    ++tries;
    // Once it may have been seen, a refused connection is a coordinator restarting: the
    // key still stands, so it is tried again.
  }
  if (!failed && tries > 1) {
    return std::unexpected(failed.error().with_context("no answer after " + std::to_string(tries) + " tries"));
  }
  return failed;
}

Result<ApiResponse> HttpApiClient::call(const std::string& method, const std::string& target,
                                        const std::string& body, const ApiHeaders& headers) {
  auto r = request(method, target, body, headers);
  if (!r && carries_key(headers)) r = send_again(method, target, body, headers, std::move(r));
  if (!r) {
    // A CA read only when the kept TLS session was not resumed is still a setting to fix.
    ErrorCode code = r.error().code() == ErrorCode::Timeout           ? ErrorCode::Timeout
                     : r.error().code() == ErrorCode::InvalidArgument ? ErrorCode::InvalidArgument
                                                                       : ErrorCode::Unavailable;
    return make_error(code, r.error().message());
  }
  if (!via_keeper_ && !keeper_to_start_.empty()) {
    start_keeper(keeper_, settings_used_, keeper_to_start_);
    keeper_to_start_.clear();
  }
  return ApiResponse{r->status, std::move(r->body)};
}

Error error_from_response(const ApiResponse& response) {
  std::string message;
  if (auto j = protocol::parse_json(response.body, 1024 * 1024); j && j->is_object()) {
    protocol::JsonReader r(*j);
    message = r.str("error", 64 * 1024, "");
  }
  if (message.empty()) message = "the coordinator answered HTTP " + std::to_string(response.status);
  switch (response.status) {
    case 400:
      return Error(ErrorCode::InvalidArgument, message);
    case 401:
      return Error(ErrorCode::Unauthenticated, "not authenticated: " + message);
    case 403:
      return Error(ErrorCode::PermissionDenied, "not allowed: " + message);
    case 404:
      return Error(ErrorCode::NotFound, message);
    case 409:
      return Error(ErrorCode::Conflict, message);
    case 413:
    case 422:
      return Error(ErrorCode::ResourceExhausted, message);
    default:
      return Error(ErrorCode::Internal, message);
  }
}

}  // namespace corral::cli
