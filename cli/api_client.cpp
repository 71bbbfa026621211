#include "cli/api_client.hpp"

#include <algorithm>
#include <cctype>

#include "common/net/http_client.hpp"
#include "common/protocol/json_reader.hpp"

namespace corral::cli {

namespace {

bool same_header_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

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
                                                 const std::string& body) {
  if (!http_) {
    if (auto c = connect(/*try_keeper=*/true); !c) return std::unexpected(c.error());
  }
  auto r = http_->request(method, target, body, {{"Authorization", "Bearer " + token_}});
  if (r && via_keeper_) {
    // The keeper's own failure to reach the coordinator is this command's failure, as if
    // it had gone directly: the keeper's error code, the coordinator's message.
    for (const auto& [name, value] : r->headers) {
      if (!same_header_name(name, kKeeperErrorHeader)) continue;
      ErrorCode code = ErrorCode::Unavailable;
      for (ErrorCode c : {ErrorCode::Timeout, ErrorCode::InvalidArgument}) {
        if (value == to_string(c)) code = c;
      }
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
    if (r.error().code() == ErrorCode::Timeout) {
      return make_error(ErrorCode::Timeout, "no answer through the connection keeper (" + r.error().message() +
                                                "); the request may have reached the coordinator");
    }
    return make_error(ErrorCode::Unavailable, "the connection keeper ended before answering (" + r.error().message() +
                                                  "); the request may have reached the coordinator");
  }
  if (auto c = connect(/*try_keeper=*/false); !c) return std::unexpected(c.error());
  return http_->request(method, target, body, {{"Authorization", "Bearer " + token_}});
}

Result<ApiResponse> HttpApiClient::call(const std::string& method, const std::string& target,
                                        const std::string& body) {
  auto r = request(method, target, body);
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
