// The coordinator's HTTP API (docs/api.md), its metrics and its status page.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <set>

#include "common/core/strings.hpp"
#include "common/core/version.hpp"
#include "common/model/job_spec_yaml.hpp"
#include "common/net/pki.hpp"
#include "common/protocol/json_reader.hpp"
#include "common/protocol/model_json.hpp"
#include "coordinator/service/coordinator.hpp"
#include "coordinator/service/views.hpp"

namespace corral::service {

using model::JobState;

namespace {

net::HttpResponse json_response(int status, const Json& body) {
  return {status, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace), {}};
}

// A JSON array written one element at a time: a list of 10,000 jobs is never one
// document in memory, and each element's nodes are reused for the next.
class JsonArrayWriter {
 public:
  void add(const Json& element) {
    text_ += text_.size() == 1 ? "" : ",";
    text_ += element.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  net::HttpResponse response() && {
    text_ += ']';
    return {200, "application/json", std::move(text_), {}};
  }

 private:
  std::string text_ = "[";
};

net::HttpResponse error_response(int status, const std::string& message) {
  return json_response(status, Json{{"error", message}});
}

int http_status_for(const Error& error) {
  switch (error.code()) {
    case ErrorCode::InvalidArgument: return 400;
    case ErrorCode::PermissionDenied: return 403;
    case ErrorCode::NotFound: return 404;
    default: return 409;
  }
}

std::optional<model::JobId> parse_id(std::string_view text) {
  auto id = parse_int<model::JobId>(text);
  if (!id || *id <= 0) return std::nullopt;
  return id;
}

// "/v1/jobs/42/cancel" -> {"v1", "jobs", "42", "cancel"}
std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  while (!path.empty()) {
    if (path.front() == '/') {
      path.remove_prefix(1);
      continue;
    }
    auto slash = path.find('/');
    parts.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash);
  }
  return parts;
}

}  // namespace

Result<JobFilter> parse_job_filter(const std::vector<std::string>& users, const std::vector<std::string>& states) {
  JobFilter f;
  for (const auto& u : users) {
    if (u.empty() || u.size() > 64) {
      return make_error(ErrorCode::InvalidArgument, "user: " + quote_for_message(u) + " is not a user name");
    }
    f.users.insert(u);
  }
  // As squeue --states: names in any case, and Slurm's short codes.
  static const std::map<std::string, JobState, std::less<>> kShort = {
      {"PD", JobState::Pending},   {"ST", JobState::Starting},  {"R", JobState::Running},
      {"CG", JobState::Ending},    {"CD", JobState::Completed}, {"F", JobState::Failed},
      {"CA", JobState::Cancelled}, {"TO", JobState::Timeout},   {"NF", JobState::NodeFail}};
  for (const auto& text : states) {
    std::string upper = text;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    auto state = model::parse_job_state(upper);
    if (!state) {
      if (auto it = kShort.find(upper); it != kShort.end()) state = it->second;
    }
    if (!state) {
      std::vector<std::string> names;
      for (JobState s : model::kAllJobStates) names.emplace_back(model::to_string(s));
      return make_error(ErrorCode::InvalidArgument,
                        "state: " + quote_for_message(text) + " is not a job state (" + join(names, ", ") + ")");
    }
    f.states.insert(*state);
  }
  return f;
}

bool JobFilter::matches(const store::JobRecord& rec) const {
  return (users.empty() || users.contains(rec.user)) && (states.empty() || states.contains(rec.state));
}

bool JobFilter::live_only() const {
  return !states.empty() && std::none_of(states.begin(), states.end(), [](JobState s) { return model::is_terminal(s); });
}

Result<Coordinator::Caller> Coordinator::authenticate(const net::HttpRequest& request) {
  if (request.header_count("authorization") > 1) {
    return make_error(ErrorCode::Unauthenticated, "more than one Authorization header");
  }
  std::string auth = request.header("authorization");
  // The scheme is case-insensitive (RFC 9110, 11.1): "bearer T" is as good as "Bearer T".
  constexpr std::string_view kBearer = "bearer ";
  auto scheme_is_bearer = [&] {
    return std::equal(kBearer.begin(), kBearer.end(), auth.begin(),
                      [](char want, char got) { return want == std::tolower(static_cast<unsigned char>(got)); });
  };
  if (auth.size() <= kBearer.size() || auth.size() > 512 || !scheme_is_bearer()) {
    return make_error(ErrorCode::Unauthenticated, "missing bearer token (Authorization: Bearer TOKEN)");
  }
  auto caller = caller_for(net::sha256_hex(std::string_view(auth).substr(kBearer.size())));
  if (!caller) return std::unexpected(caller.error());
  if (!*caller) return make_error(ErrorCode::Unauthenticated, "unknown token");
  return std::move(**caller);
}

Result<std::optional<Coordinator::Caller>> Coordinator::caller_for(const std::string& token_hash) {
  const Instant now = clock_.mono();
  auto cached = users_.find(token_hash);
  if (cached == users_.end() || now - cached->second.checked >= kTokenRecheck) {
    // A token added by `corral-coordinator add-user` while we run is found on first use;
    // one it replaced is gone from the database and so, within kTokenRecheck, from here.
    auto user = store_.user_by_token_hash(token_hash);
    if (!user) return std::unexpected(user.error());
    if (!*user) {
      if (cached != users_.end()) users_.erase(cached);
      return std::nullopt;
    }
    cached = users_.insert_or_assign(token_hash, CachedUser{**user, now}).first;
  }
  return Caller{cached->second.user.name, cached->second.user.admin, token_hash};
}

void Coordinator::on_http(const net::HttpRequest& request, Respond respond) {
  ++stats_.http_requests;
  if (request.method == "GET") {
    // The page holds no data: it loads without a token, and asks for one where needed.
    if (request.path == "/" || request.path == "/status.js") return respond(status_page(request.path));
    if (request.path == "/metrics" || request.path == "/v1/status" || request.path == "/v1/status/events") {
      auto caller = status_reader(request);
      if (!caller) {
        int status = caller.error().code() == ErrorCode::Unauthenticated ? 401 : 503;
        return respond(error_response(status, caller.error().message()));
      }
      const Caller* who = *caller ? &**caller : nullptr;
      if (request.path == "/metrics") return respond(metrics(who));
      if (request.path == "/v1/status") return respond(status(request, who));
      // Only a private page's stream ends with its token; the feed says no more than
      // that something changed, so a public one is anyone's.
      return respond(status_events(!config_.public_status && who ? who->token_hash : std::string()));
    }
  }
  if (request.path.rfind("/v1/", 0) != 0) return respond(error_response(404, "no such endpoint: " + request.path));
  auto caller = authenticate(request);
  if (!caller) {
    int status = caller.error().code() == ErrorCode::Unauthenticated ? 401 : 503;
    return respond(error_response(status, caller.error().message()));
  }
  if (const auto& failing = committer_.failing();
      failing && request.method != "GET" && request.method != "HEAD" && !retries_held_submit(request, caller->user)) {
    // Refused before the ledger sees it: memory goes no further ahead of the disk.
    return respond(error_response(503, "the coordinator cannot write its database now (" + failing->message() +
                                           "); nothing was changed: try again once it can"));
  }
  route(request, *caller, std::move(respond));
}

Result<std::optional<Coordinator::Caller>> Coordinator::status_reader(const net::HttpRequest& request) {
  // A public page ignores a token unless private data makes who asks matter: then a token
  // given must be good (a stale one would otherwise hide the caller's own jobs unseen).
  if (config_.public_status && (!config_.private_data.any() || request.header_count("authorization") == 0)) {
    return std::optional<Caller>();
  }
  auto caller = authenticate(request);
  if (!caller) return std::unexpected(caller.error());
  return std::optional<Caller>(std::move(*caller));
}

bool Coordinator::job_hidden_from(const std::string& owner, const Caller* caller) const {
  if (!config_.private_data.jobs) return false;
  return caller == nullptr || (!caller->admin && caller->user != owner);
}

bool Coordinator::retries_held_submit(const net::HttpRequest& request, const std::string& user) const {
  // Its first try waits with the batch the store could not write yet: the retry waits
  // for the same commit (SubmitKeys), as it would with a store that writes, rather than
  // hear "refused" about a job that will exist.
  if (request.method != "POST" || request.path != "/v1/jobs") return false;
  auto key = SubmitKeys::key_of(request);
  return key && !key->empty() && submit_keys_.in_flight(user, *key);
}

void Coordinator::route(const net::HttpRequest& request, const Caller& caller, Respond respond) {
  auto parts = split_path(request.path);
  const std::string& m = request.method;
  if (parts.size() == 2 && parts[1] == "whoami" && m == "GET") {
    return respond(json_response(200, Json{{"user", caller.user}, {"admin", caller.admin}}));
  }
  if (parts.size() >= 2 && parts[1] == "jobs") {
    if (parts.size() == 2) {
      if (m == "POST") return submit(request, caller, std::move(respond));
      if (m == "GET") return respond(list_jobs(request, caller));
      return respond(error_response(405, "use GET or POST on /v1/jobs"));
    }
    if (parts.size() == 3 && parts[2] == "cancel") {
      if (m != "POST") return respond(error_response(405, "use POST on /v1/jobs/cancel"));
      return after_commit(cancel_jobs(request, caller), std::move(respond));
    }
    auto id = resolve_job_ref(parts[2]);
    if (!id) return respond(error_response(id.error().code() == ErrorCode::NotFound ? 404 : 400, id.error().message()));
    if (parts.size() == 3 && m == "GET") {
      if (request.query.contains("wait")) return wait_job(*id, request, caller, std::move(respond));
      return respond(show_job(*id, &caller));
    }
    if (parts.size() == 4 && parts[3] == "cancel" && m == "POST") {
      // 42 stands for the whole array; 42_0 for its element 0 alone (as scancel reads them).
      bool whole_array = parts[2].find('_') == std::string::npos;
      return after_commit(cancel_job(*id, caller, whole_array), std::move(respond));
    }
    if (parts.size() == 4 && parts[3] == "logs" && m == "GET") return job_logs(*id, request, caller, std::move(respond));
    if (parts.size() == 4 && parts[3] == "stack" && m == "GET") return job_stack(*id, request, caller, std::move(respond));
  }
  if (parts.size() == 2 && parts[1] == "history" && m == "GET") return history(request, caller, std::move(respond));
  if (parts.size() == 2 && parts[1] == "usage" && m == "GET") return usage(request, caller, std::move(respond));
  if (parts.size() >= 2 && parts[1] == "nodes") {
    if (parts.size() == 2 && m == "GET") return respond(list_nodes(request, caller));
    if (parts.size() == 4 && m == "POST" && (parts[3] == "drain" || parts[3] == "resume")) {
      if (!caller.admin) return respond(error_response(403, "only an admin may drain or resume nodes"));
      return after_commit(drain_node(std::string(parts[2]), request, parts[3] == "drain"), std::move(respond));
    }
    if (parts.size() == 4 && m == "POST" && parts[3] == "clear") {
      if (!caller.admin) return respond(error_response(403, "only an admin may clear a node's unconfirmed ranks"));
      return after_commit(clear_node(std::string(parts[2]), caller), std::move(respond));
    }
  }
  respond(error_response(404, "no such endpoint: " + m + " " + request.path));
}

Result<model::JobId> Coordinator::resolve_job_ref(std::string_view text) {
  auto underscore = text.find('_');
  if (underscore == std::string_view::npos) {
    auto id = parse_id(text);
    if (!id) return make_error(ErrorCode::InvalidArgument, "job id must be a positive integer (or ARRAY_INDEX)");
    return *id;
  }
  // "42_7": element 7 of array 42.
  auto array = parse_id(text.substr(0, underscore));
  auto index = parse_int<int>(text.substr(underscore + 1));
  if (!array || !index || *index < 0) {
    return make_error(ErrorCode::InvalidArgument, "job id must be a positive integer (or ARRAY_INDEX)");
  }
  for (model::JobId e : ledger_.array_elements(*array)) {
    const Job* job = ledger_.live_job(e);
    if (job != nullptr && job->record.array && job->record.array->index == *index) return e;
  }
  auto stored = store_.array_element(*array, *index);
  if (!stored) return std::unexpected(stored.error());
  if (!*stored) return make_error(ErrorCode::NotFound, "no job " + std::string(text));
  return **stored;
}

void Coordinator::after_commit(net::HttpResponse response, Respond respond) {
  // What the response reports must be durable before anyone reads it.
  committer_.then([respond = std::move(respond), response = std::move(response)] { respond(response); });
}

namespace {

// 201 for a submission: its first job (an array's id) and every job it made.
net::HttpResponse submitted_response(const std::vector<model::JobId>& ids, bool repeated) {
  Json j{{"id", ids.front()}, {"ids", ids}};
  if (repeated) j["repeated"] = true;
  return json_response(201, j);
}

}  // namespace

void Coordinator::submit(const net::HttpRequest& request, const Caller& caller, Respond respond) {
  auto key = SubmitKeys::key_of(request);
  if (!key) return respond(error_response(400, key.error().message()));
  auto body = protocol::parse_json(request.body, config_.max_request_bytes);
  if (!body) return respond(error_response(400, body.error().message()));
  protocol::JsonReader r(*body);
  std::string spec_text = r.str("spec", 64 * 1024);
  std::string file = r.str("file", 256, "job.yaml");
  bool dry_run = r.boolean("dry_run", false);
  model::Submission submission;
  submission.dir = r.str("submit_dir", 4096, "");
  if (const Json* env = r.array("environment", model::kMaxExportedVariables, false)) {
    for (std::size_t i = 0; i < env->size() && r.ok(); ++i) {
      const Json& kv = (*env)[i];
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) {
        r.fail(r.item_path("environment", i), "must be a [name, value] pair of strings");
        break;
      }
      submission.env.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
    }
  }
  if (!r.ok()) return respond(error_response(400, r.error()));
  if (!dry_run && !key->empty()) {
    // A retry of a submission that was made already: its jobs, whatever the cluster or
    // the spec's checks say now. One primary-key read.
    auto made = submit_keys_.find(caller.user, *key, respond);
    if (!made) return respond(error_response(503, "cannot read the submit key: " + made.error().message()));
    if (*made && (*made)->empty()) return;  // its commit is under way: answered with it
    if (*made) return respond(submitted_response(**made, /*repeated=*/true));
  }
  if (auto ok = model::check_submission(submission); !ok) return respond(error_response(400, ok.error().message()));
  auto parsed = model::parse_job_spec_detailed(spec_text);
  if (!parsed.problems.empty()) {
    Json problems = Json::array();
    for (const auto& p : parsed.problems) problems.push_back(p.format(file));
    return respond(json_response(400, Json{{"error", "invalid job spec"}, {"problems", problems}}));
  }
  model::JobSpec spec = std::move(*parsed.spec);
  if (auto ok = ledger_.scheduler().admissible(spec); !ok) return respond(error_response(422, ok.error().message()));
  const Now now = clock_.read();
  if (dry_run) {
    auto d = ledger_.scheduler().dry_run(spec, caller.user, now.mono);
    Json j{{"dry_run", true}, {"would_start", d.allocation.has_value()}};
    if (d.allocation) {
      j["allocation"] = protocol::to_json(*d.allocation);
    } else {
      j["reason"] = std::string(sched::to_string(d.reason.code));
      j["detail"] = d.reason.detail;
    }
    return respond(json_response(200, j));
  }
  auto submitted = ledger_.submit(caller.user, std::move(spec), spec_text, now, std::move(submission), ended_lookup());
  if (!submitted) return respond(error_response(400, submitted.error().message()));
  model::JobId id = submitted->id;
  if (!key->empty()) submit_keys_.record(caller.user, *key, submitted->ids, now.wall, submitted->change);
  committer_.enqueue(std::move(submitted->change), [this, respond, ids = submitted->ids, user = caller.user,
                                                    key = std::move(*key)](const Result<void>& ok) {
    // Retries that came while this was being written get what the first gets.
    auto retries = key.empty() ? std::vector<Respond>{} : submit_keys_.settle(user, key);
    if (!ok) {
      auto failed = error_response(503, "not stored: " + ok.error().message());
      respond(failed);
      for (const auto& retry : retries) retry(failed);
      return;
    }
    respond(submitted_response(ids, /*repeated=*/false));
    for (const auto& retry : retries) retry(submitted_response(ids, /*repeated=*/true));
  });
  // A dependency that can never be met has cancelled the job already: that comes after.
  flush_effects();
  // Every other change asks for its own pass; a job with no room for it now changes
  // nothing a pass would do, so a long queue is not rescanned for each submission.
  if (submitted->ids.size() > 1 || ledger_.might_start_now(id)) request_pass();
}

namespace {

JobView view_of(const store::JobRecord& rec, const model::JobSpec* spec, const sched::SchedJob* live) {
  JobView v;
  v.record = &rec;
  if (spec != nullptr) {
    auto shapes = model::candidate_shapes(*spec);
    v.gpus = model::total_gpus(*spec);
    v.nodes = spec->nodes.value_or(shapes.empty() ? 1 : shapes.front().first);
    v.retries = spec->retries;
    v.priority = spec->priority;
    v.time_limit = spec->time_limit;
    if (spec->mode == model::LaunchMode::Torch) v.rendezvous_timeout = spec->rendezvous_timeout;
    v.dependencies = spec->dependencies;
    if (spec->array) v.array_max_running = spec->array->max_running;
  }
  if (rec.allocation) v.nodes = static_cast<int>(rec.allocation->nodes.size());
  if (live != nullptr && live->state == JobState::Pending) v.pending = live->reason;
  return v;
}

}  // namespace

net::HttpResponse Coordinator::list_jobs(const net::HttpRequest& request, const Caller& caller) {
  auto query = [&](const char* key) -> std::string {
    auto it = request.query.find(key);
    return it == request.query.end() ? std::string() : it->second;
  };
  auto filter = parse_job_filter(split(query("user"), ','), split(query("state"), ','));
  if (!filter) return error_response(400, filter.error().message());
  if (!query("me").empty() && query("me") != "0") filter->users.insert(caller.user);
  // Private jobs: a user's list holds their own jobs, whatever users it names.
  if (config_.private_data.jobs && !caller.admin) {
    if (!filter->users.empty() && !filter->users.contains(caller.user)) return std::move(JsonArrayWriter()).response();
    filter->users = {caller.user};
  }
  // Without all=1 only live jobs, unless the states asked for include ended ones.
  bool all = (!query("all").empty() && query("all") != "0") ||
             (!filter->states.empty() && !filter->live_only());
  JsonArrayWriter out;
  auto add = [&](const store::JobRecord& rec, const model::JobSpec* spec) {
    if (!filter->matches(rec)) return;
    out.add(job_json(view_of(rec, spec, ledger_.scheduler().job(rec.id)), nullptr));
  };
  if (!all) {
    std::vector<const Job*> live;
    for (const auto& [id, job] : ledger_.live_jobs()) live.push_back(&job);
    std::sort(live.begin(), live.end(), [](const Job* a, const Job* b) { return a->record.id < b->record.id; });
    for (const Job* j : live) add(j->record, &j->spec);
    return std::move(out).response();
  }
  store::JobQuery q;
  if (filter->users.size() == 1) q.user = *filter->users.begin();
  auto stored = store_.jobs(q);
  if (!stored) return error_response(503, stored.error().message());
  for (const auto& rec : *stored) {
    // What is in memory may be a turn of the loop ahead of the disk.
    if (const Job* j = ledger_.any_job(rec.id)) {
      add(j->record, &j->spec);
    } else {
      auto spec = model::parse_job_spec(rec.spec_yaml, "job");
      add(rec, spec ? &*spec : nullptr);
    }
  }
  return std::move(out).response();
}

namespace {

int allocated_gpus(const store::JobRecord& rec) {
  int n = 0;
  if (rec.allocation) {
    for (const auto& na : rec.allocation->nodes) n += static_cast<int>(na.gpus.size());
  }
  return n;
}

}  // namespace

Result<Coordinator::TimeRange> Coordinator::time_range(const net::HttpRequest& request) {
  TimeRange range;
  const TimePoint now = clock_.now();
  range.since = now - std::chrono::hours(24);
  if (auto it = request.query.find("since"); it != request.query.end()) {
    auto t = parse_moment(it->second, now);
    if (!t) return make_error(ErrorCode::InvalidArgument, "since: " + t.error().message());
    range.since = *t;
  }
  if (auto it = request.query.find("until"); it != request.query.end()) {
    auto t = parse_moment(it->second, now);
    if (!t) return make_error(ErrorCode::InvalidArgument, "until: " + t.error().message());
    range.until = *t;
  }
  if (range.until && *range.until <= range.since) {
    return make_error(ErrorCode::InvalidArgument, "until: must be after since");
  }
  return range;
}

void Coordinator::read_history_from(std::shared_ptr<store::Store> reader) {
  history_reader_ = std::move(reader);
  history_work_ = std::make_unique<net::BlockingWork>(loop_, 1, "history");
}

void Coordinator::read_ended(std::function<net::HttpResponse(store::Store&)> read, Respond respond) {
  if (!history_reader_) return respond(read(store_));
  // The callback stays here, on the loop: dropped with the coordinator, never on the
  // worker (it holds the client's session).
  const std::uint64_t id = next_read_++;
  reads_waiting_.emplace(id, std::move(respond));
  history_work_->run([reader = history_reader_, read = std::move(read)] { return read(*reader); },
                     [this, id](net::HttpResponse answer) {
                       auto it = reads_waiting_.find(id);
                       if (it == reads_waiting_.end()) return;
                       Respond r = std::move(it->second);
                       reads_waiting_.erase(it);
                       r(std::move(answer));
                     });
}

void Coordinator::history(const net::HttpRequest& request, const Caller& caller, Respond respond) {
  constexpr std::size_t kMaxLimit = 100000;
  auto range = time_range(request);
  if (!range) return respond(error_response(400, range.error().message()));
  auto query = [&](const char* key) {
    auto it = request.query.find(key);
    return it == request.query.end() ? std::string() : it->second;
  };
  auto filter = parse_job_filter(split(query("user"), ','), split(query("state"), ','));
  if (!filter) return respond(error_response(400, filter.error().message()));
  std::size_t limit = kMaxLimit;
  if (std::string l = query("limit"); !l.empty()) {
    auto n = parse_int<std::size_t>(l);
    if (!n || *n == 0 || *n > kMaxLimit) {
      return respond(error_response(400, "limit: must be a number of jobs from 1 to " + std::to_string(kMaxLimit)));
    }
    limit = *n;
  }
  // Private history: a user's own ended jobs, whatever users the request names (another
  // user's are none, as sacct shows them under PrivateData).
  if (config_.private_data.history && !caller.admin) {
    if (!filter->users.empty() && !filter->users.contains(caller.user)) return respond(std::move(JsonArrayWriter()).response());
    filter->users = {caller.user};
  }
  store::EndedQuery q{range->since, range->until, limit};
  q.users.assign(filter->users.begin(), filter->users.end());
  q.states.assign(filter->states.begin(), filter->states.end());
  // Read and rendered off the loop: nothing here touches the coordinator's state.
  read_ended(
      [q = std::move(q)](store::Store& store) {
        auto ended = store.ended_jobs(q);
        if (!ended) return error_response(503, ended.error().message());
        JsonArrayWriter out;
        for (const auto& rec : *ended) {
          JobView v;
          v.record = &rec;
          v.gpus = allocated_gpus(rec);
          v.nodes = rec.allocation ? static_cast<int>(rec.allocation->nodes.size()) : 0;
          out.add(job_json(v, nullptr));
        }
        return std::move(out).response();
      },
      std::move(respond));
}

void Coordinator::usage(const net::HttpRequest& request, const Caller& caller, Respond respond) {
  auto range = time_range(request);
  if (!range) return respond(error_response(400, range.error().message()));
  std::string by = "user";
  if (auto it = request.query.find("by"); it != request.query.end()) by = it->second;
  if (by != "user" && by != "node" && by != "class") {
    return respond(error_response(400, "by: must be user, node or class, got " + quote_for_message(by)));
  }
  const store::UsageKey key = by == "user" ? store::UsageKey::User : by == "node" ? store::UsageKey::Node
                                                                                   : store::UsageKey::Class;
  // As of the request's moment: the GPU time of jobs holding GPUs now is counted here, on
  // the loop, from the ledger; the store sums the jobs ended before this moment off the
  // loop. A job that ends in between is in the first and not the second.
  const TimePoint now = clock_.now();
  const TimePoint until = range->until.value_or(now);
  constexpr double kMsPerHour = 3600.0 * 1000.0;
  struct Row {
    double gpu_hours = 0;
    std::int64_t jobs = 0;
  };
  // Private usage: a user's own jobs only, whichever way they are summed.
  const std::optional<std::string> only =
      config_.private_data.usage && !caller.admin ? std::optional<std::string>(caller.user) : std::nullopt;
  std::map<std::string, Row> running;
  if (!range->until || *range->until > now) {
    auto product = [&](const std::string& node, int gpu) -> std::string {
      if (const auto* n = ledger_.scheduler().node(node)) {
        for (const auto& g : n->gpus) {
          if (g.index == gpu) return g.cls.product;
        }
      }
      return "unknown";
    };
    for (const auto& [id, job] : ledger_.live_jobs()) {
      const auto& rec = job.record;
      if (!model::holds_resources(rec.state) || !rec.allocation || !rec.started_at) continue;
      if (only && rec.user != *only) continue;
      const TimePoint from = std::max(*rec.started_at, range->since);
      if (now <= from) continue;
      const double hours = static_cast<double>((now - from).count()) / kMsPerHour;
      std::set<std::string> counted;
      for (const auto& na : rec.allocation->nodes) {
        for (int g : na.gpus) {
          const std::string k = key == store::UsageKey::User ? rec.user
                                : key == store::UsageKey::Node ? na.node
                                                               : product(na.node, g);
          Row& row = running[k];
          row.gpu_hours += hours;
          if (counted.insert(k).second) ++row.jobs;
        }
      }
    }
  }
  store::EndedQuery q{range->since, until, 0};
  if (only) q.users = {*only};
  read_ended(
      [q, key, by, since = range->since, until, own_only = only.has_value(), rows = std::move(running)](store::Store& store) mutable {
        auto ended = store.gpu_usage(q, key);
        if (!ended) return error_response(503, ended.error().message());
        for (const auto& r : *ended) {
          Row& row = rows[r.key];
          row.gpu_hours += static_cast<double>(r.gpu_ms) / kMsPerHour;
          row.jobs += r.jobs;
        }
        std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
        std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
          return a.second.gpu_hours != b.second.gpu_hours ? a.second.gpu_hours > b.second.gpu_hours
                                                          : a.first < b.first;
        });
        Json list = Json::array();
        double total = 0;
        for (const auto& [name, row] : sorted) {
          total += row.gpu_hours;
          list.push_back(Json{{by, name}, {"gpu_hours", row.gpu_hours}, {"jobs", row.jobs}});
        }
        return json_response(200, Json{{"since", format_time(since)},
                                       {"until", format_time(until)},
                                       {"by", by},
                                       {"total_gpu_hours", total},
                                       {"own_only", own_only},
                                       {"rows", list}});
      },
      std::move(respond));
}

void Coordinator::wait_job(model::JobId id, const net::HttpRequest& request, const Caller& caller,
                           std::function<void(net::HttpResponse)> respond) {
  constexpr int kMaxWaitSeconds = 60;
  const std::string& text = request.query.at("wait");
  int seconds = -1;
  if (!text.empty() && text.size() <= 2 && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    seconds = std::stoi(text);
  }
  if (seconds < 0 || seconds > kMaxWaitSeconds) {
    return respond(error_response(400, "wait must be a whole number of seconds from 0 to " + std::to_string(kMaxWaitSeconds)));
  }
  // Ended (or unknown) jobs answer at once; so does a live job asked not to wait, and one
  // private from the caller (as one that does not exist).
  const Job* live = ledger_.live_job(id);
  if (live == nullptr || seconds == 0 || job_hidden_from(live->record.user, &caller)) return respond(show_job(id, &caller));
  job_waits_.emplace(id, JobWait{std::move(respond), clock_.mono() + std::chrono::seconds(seconds)});
}

void Coordinator::answer_job_waits(model::JobId id) {
  auto [first, last] = job_waits_.equal_range(id);
  if (first == last) return;
  net::HttpResponse res = show_job(id);
  for (auto it = first; it != last; ++it) it->second.respond(res);
  job_waits_.erase(first, last);
}

net::HttpResponse Coordinator::show_job(model::JobId id, const Caller* caller) {
  auto events = store_.events(id);
  if (!events) return error_response(503, events.error().message());
  // The spec may carry what its owner would not show everyone (environment values).
  auto with_spec = [&](Json j, const store::JobRecord& rec) {
    if (caller != nullptr && !refuse_other_users_job(rec, *caller)) j["spec"] = rec.spec_yaml;
    return json_response(200, j);
  };
  // A null caller is a parked wait, whose caller was checked when it was parked.
  auto hidden = [&](const store::JobRecord& rec) { return caller != nullptr && job_hidden_from(rec.user, caller); };
  if (const Job* j = ledger_.any_job(id)) {
    if (hidden(j->record)) return error_response(404, "no job " + std::to_string(id));
    return with_spec(job_json(view_of(j->record, &j->spec, ledger_.scheduler().job(id)), &*events), j->record);
  }
  auto rec = store_.job(id);
  if (!rec) return error_response(503, rec.error().message());
  if (!*rec || hidden(**rec)) return error_response(404, "no job " + std::to_string(id));
  auto spec = model::parse_job_spec((*rec)->spec_yaml, "job");
  return with_spec(job_json(view_of(**rec, spec ? &*spec : nullptr, nullptr), &*events), **rec);
}

Result<const Coordinator::Job*> Coordinator::cancel_one(model::JobId id, const Caller& caller) {
  const Job* live = ledger_.live_job(id);
  if (live != nullptr && job_hidden_from(live->record.user, &caller)) {
    return make_error(ErrorCode::NotFound, "no job " + std::to_string(id));
  }
  if (live == nullptr) {
    auto rec = store_.job(id);
    if (rec && *rec && !job_hidden_from((*rec)->user, &caller)) {
      return make_error(ErrorCode::Conflict,
                        "job " + std::to_string(id) + " already ended " + std::string(model::to_string((*rec)->state)));
    }
    return make_error(ErrorCode::NotFound, "no job " + std::to_string(id));
  }
  if (auto ok = ledger_.cancel(id, caller.user, caller.admin, clock_.read()); !ok) {
    return std::unexpected(ok.error());
  }
  return ledger_.any_job(id);
}

net::HttpResponse Coordinator::cancel_job(model::JobId id, const Caller& caller, bool whole_array) {
  // An array's id stands for the whole array: every live element is cancelled.
  auto elements = whole_array ? ledger_.array_elements(id) : std::vector<model::JobId>{};
  if (!elements.empty()) {
    Json cancelled = Json::array();
    std::optional<Error> refused;
    // The answer shows the array's first element (its id) as it is now, else the first
    // element cancelled; each taken as it is cancelled, since cancelling thousands of
    // pending elements ends more jobs than the ledger keeps (Ledger::forget_ended).
    std::optional<Json> shown;
    for (model::JobId e : elements) {
      if (auto done = cancel_one(e, caller)) {
        cancelled.push_back(e);
        if (e == id || cancelled.size() == 1) shown = job_json(view_of((*done)->record, &(*done)->spec, nullptr), nullptr);
      } else if (!refused) {
        refused = done.error();
      }
    }
    flush_effects();
    if (cancelled.empty() && refused) return error_response(http_status_for(*refused), refused->message());
    if (cancelled.front().get<model::JobId>() != id) {
      // The first element had ended before: from memory if it ended lately, else the store.
      if (const Job* first = ledger_.any_job(id)) {
        shown = job_json(view_of(first->record, &first->spec, nullptr), nullptr);
      } else if (auto rec = store_.job(id); rec && *rec) {
        shown = job_json(view_of(**rec, nullptr, nullptr), nullptr);
      }
    }
    Json j = std::move(*shown);
    j["array_cancelled"] = cancelled;
    return json_response(200, j);
  }
  auto job = cancel_one(id, caller);
  flush_effects();
  if (!job) return error_response(http_status_for(job.error()), job.error().message());
  return json_response(200, job_json(view_of((*job)->record, &(*job)->spec, nullptr), nullptr));
}

net::HttpResponse Coordinator::cancel_jobs(const net::HttpRequest& request, const Caller& caller) {
  constexpr std::size_t kMaxIds = 100000;
  auto body = protocol::parse_json(request.body.empty() ? "{}" : request.body, config_.max_request_bytes);
  if (!body) return error_response(400, body.error().message());
  protocol::JsonReader r(*body);
  std::vector<model::JobId> ids;
  std::set<model::JobId> whole_arrays;  // plain ids: an array's id stands for every element
  Json unresolved = Json::array();
  if (const Json* list = r.array("ids", kMaxIds, false)) {
    for (std::size_t i = 0; i < list->size(); ++i) {
      const Json& v = (*list)[i];
      if (v.is_number_integer() && v.get<long long>() > 0) {
        ids.push_back(v.get<model::JobId>());
        whole_arrays.insert(ids.back());
        continue;
      }
      // ARRAY_INDEX ("42_7") as text; one that names no job is answered as a refusal.
      std::optional<Result<model::JobId>> ref;
      if (v.is_string() && v.get_ref<const std::string&>().size() <= 32) ref = resolve_job_ref(v.get<std::string>());
      if (!ref || (!*ref && (*ref).error().code() == ErrorCode::InvalidArgument)) {
        r.fail(r.item_path("ids", i), "must be a job id (a positive integer, or ARRAY_INDEX like \"42_7\")");
        break;
      }
      if (*ref) {
        ids.push_back(**ref);
      } else {
        unresolved.push_back(Json{{"id", v}, {"status", 404}, {"error", (*ref).error().message()}});
      }
    }
  }
  auto strings = [&](const char* key) {
    std::vector<std::string> out;
    if (const Json* list = r.array(key, 1024, false)) {
      for (std::size_t i = 0; i < list->size(); ++i) {
        if (!(*list)[i].is_string()) {
          r.fail(r.item_path(key, i), "must be a string");
          break;
        }
        out.push_back((*list)[i].get<std::string>());
      }
    }
    return out;
  };
  std::vector<std::string> users = strings("user");
  std::vector<std::string> states = strings("state");
  if (!r.ok()) return error_response(400, r.error());
  const bool by_filter = !users.empty() || !states.empty();
  if ((ids.empty() && unresolved.empty()) == !by_filter) {
    return error_response(400, "give either ids, or user and/or state to choose the jobs to cancel");
  }
  auto filter = parse_job_filter(users, states);
  if (!filter) return error_response(400, filter.error().message());
  if (by_filter) {
    // Without a user: the caller's own jobs, admin or not; naming someone else's needs an admin.
    if (filter->users.empty()) filter->users.insert(caller.user);
    for (const auto& u : filter->users) {
      if (u != caller.user && !caller.admin) {
        return error_response(403, "not allowed: only an admin may cancel another user's jobs (" + u + ")");
      }
    }
    for (const auto& [id, job] : ledger_.live_jobs()) {
      if (filter->matches(job.record)) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
  }
  // An array's id given as a plain id stands for its live elements; an ARRAY_INDEX ref
  // (42_0) or a job a filter matched is that element alone.
  std::vector<model::JobId> expanded;
  for (model::JobId id : ids) {
    auto elements = whole_arrays.contains(id) ? ledger_.array_elements(id) : std::vector<model::JobId>{};
    if (elements.empty()) {
      expanded.push_back(id);
    } else {
      expanded.insert(expanded.end(), elements.begin(), elements.end());
    }
  }
  Json cancelled = Json::array();
  Json failed = unresolved;
  for (model::JobId id : expanded) {
    auto job = cancel_one(id, caller);
    if (job) {
      cancelled.push_back(Json{{"id", id}, {"state", std::string(model::to_string((*job)->record.state))}});
    } else {
      failed.push_back(Json{{"id", id}, {"status", http_status_for(job.error())}, {"error", job.error().message()}});
    }
  }
  flush_effects();
  return json_response(200, Json{{"cancelled", cancelled}, {"failed", failed}});
}

void Coordinator::job_logs(model::JobId id, const net::HttpRequest& request, const Caller& caller, Respond respond) {
  const Job* job = ledger_.any_job(id);
  std::optional<store::JobRecord> stored;
  if (job == nullptr) {
    auto rec = store_.job(id);
    if (!rec) return respond(error_response(503, rec.error().message()));
    if (!*rec) return respond(error_response(404, "no job " + std::to_string(id)));
    stored = std::move(**rec);
  }
  const store::JobRecord& rec = job ? job->record : *stored;
  if (auto no = refuse_other_users_job(rec, caller)) return respond(std::move(*no));
  auto number = [&](const char* key, std::uint64_t dflt) -> std::optional<std::uint64_t> {
    auto it = request.query.find(key);
    if (it == request.query.end()) return dflt;
    return parse_int<std::uint64_t>(it->second);
  };
  auto rank = number("rank", 0);
  auto offset = number("offset", 0);
  auto max = number("max", 1 << 20);
  if (!rank || !offset || !max) return respond(error_response(400, "rank, offset and max must be non-negative integers"));
  if (*rank > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    return respond(error_response(400, "rank: " + std::to_string(*rank) + " is not a rank"));
  }
  auto it = std::find_if(rec.ranks.begin(), rec.ranks.end(), [&](const auto& r) { return r.rank == static_cast<int>(*rank); });
  if (it == rec.ranks.end()) {
    return respond(error_response(404, "job " + std::to_string(id) + " has no rank " + std::to_string(*rank) +
                                           (rec.ranks.empty() ? " (it has not started)" : "")));
  }
  if (!ledger_.connected(it->node) || !conns_.contains(it->node)) {
    return respond(error_response(503, "the agent of node " + it->node + " is not connected"));
  }
  std::uint64_t request_id = next_log_request_++;
  log_waits_[request_id] = {std::move(respond), it->rank, it->node, clock_.mono() + std::chrono::seconds(10)};
  send(it->node, protocol::LogRequest{request_id, id, rec.attempt, it->rank, *offset, std::min<std::uint64_t>(*max, 4 << 20)});
}

std::optional<net::HttpResponse> Coordinator::refuse_other_users_job(const store::JobRecord& rec,
                                                                    const Caller& caller) const {
  if (rec.user == caller.user || caller.admin) return std::nullopt;
  if (job_hidden_from(rec.user, &caller)) return error_response(404, "no job " + std::to_string(rec.id));
  return error_response(403, "job " + std::to_string(rec.id) + " belongs to " + rec.user);
}

void Coordinator::job_stack(model::JobId id, const net::HttpRequest& request, const Caller& caller, Respond respond) {
  const Job* job = ledger_.any_job(id);
  if (job == nullptr) {
    auto rec = store_.job(id);
    if (!rec) return respond(error_response(503, rec.error().message()));
    if (!*rec || job_hidden_from((*rec)->user, &caller)) return respond(error_response(404, "no job " + std::to_string(id)));
    return respond(error_response(409, "job " + std::to_string(id) + " has ended: no rank is left to look at"));
  }
  const store::JobRecord& rec = job->record;
  if (auto no = refuse_other_users_job(rec, caller)) return respond(std::move(*no));
  std::optional<int> only;
  if (auto it = request.query.find("rank"); it != request.query.end()) {
    auto rank = parse_int<std::uint64_t>(it->second);
    if (!rank || *rank > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
      return respond(error_response(400, "rank: must be a non-negative integer, got \"" + it->second.substr(0, 32) + "\""));
    }
    only = static_cast<int>(*rank);
  }
  StackWait wait;
  wait.job = id;
  wait.deadline = clock_.mono() + kStackAnswerTime;
  std::map<std::string, std::vector<int>> by_node;
  for (const auto& r : rec.ranks) {
    if (only && r.rank != *only) continue;
    if (model::rank_ended(r.state) || r.pid == 0) {
      wait.reports[r.rank] = {r.node, "rank " + std::to_string(r.rank) + " is not running (" +
                                          std::string(model::to_string(r.state)) + ")\n"};
      continue;
    }
    if (!ledger_.connected(r.node) || !conns_.contains(r.node)) {
      wait.reports[r.rank] = {r.node, "the agent of node " + r.node + " is not connected\n"};
      continue;
    }
    wait.reports[r.rank] = {r.node, {}};
    by_node[r.node].push_back(r.rank);
  }
  if (wait.reports.empty()) {
    return respond(error_response(404, "job " + std::to_string(id) + (only ? " has no rank " + std::to_string(*only)
                                                                          : " has no ranks (it has not started)")));
  }
  std::uint64_t request_id = next_log_request_++;
  for (const auto& [node, ranks] : by_node) {
    wait.asked.insert(node);
    send(node, protocol::StackRequest{request_id, id, rec.attempt, ranks});
  }
  wait.respond = std::move(respond);
  if (wait.asked.empty()) return answer_stack(std::move(wait));
  stack_waits_.emplace(request_id, std::move(wait));
}

void Coordinator::link_view(const std::string& node, const Now& now, NodeView& v) const {
  const auto* link = ledger_.link(node);
  if (link == nullptr) return;
  v.connected = link->connected;
  v.last_seen = now.date_of(link->last_seen);
  if (!link->connected || link->silent) v.silent_since = now.date_of(link->silent ? link->silent_from : link->last_seen);
  if (auto at = ledger_.lost_at(node)) v.lost_at = now.date_of(*at);
  v.driver = link->driver;
  v.cuda = link->cuda.to_string();
}

void Coordinator::answer_stack(StackWait wait) {
  Json ranks = Json::array();
  for (auto& [rank, r] : wait.reports) {
    if (r.second.empty()) r.second = "the agent of node " + r.first + " did not answer in time\n";
    ranks.push_back(Json{{"rank", rank}, {"node", r.first}, {"report", r.second}});
  }
  wait.respond(json_response(200, Json{{"job", wait.job}, {"ranks", ranks}}));
}

net::HttpResponse Coordinator::list_nodes(const net::HttpRequest& request, const Caller& caller) {
  NodeGpus gpus = NodeGpus::Each;
  if (auto it = request.query.find("gpus"); it != request.query.end()) {
    if (it->second == "classes") {
      gpus = NodeGpus::Classes;
    } else if (it->second != "each") {
      return error_response(400, "gpus: must be each (every GPU, the default) or classes (grouped by class)");
    }
  }
  const Now now = clock_.read();
  std::string out = "[";
  std::vector<std::string> names;
  for (const auto* node : ledger_.scheduler().nodes()) {
    NodeView v;
    v.node = node;
    link_view(node->name, now, v);
    for (const auto& g : node->gpus) {
      auto holder = ledger_.scheduler().gpu_holder(node->name, g.index);
      if (holder && config_.private_data.jobs) {
        const Job* j = ledger_.any_job(*holder);
        if (j == nullptr || job_hidden_from(j->record.user, &caller)) holder = 0;  // held, by a job not shown
      }
      v.holders.push_back(holder);
    }
    if (!names.empty()) out += ',';
    node_listing_->append(v, gpus, out);
    names.push_back(node->name);
  }
  out += ']';
  std::sort(names.begin(), names.end());
  node_listing_->keep_only(names);
  return {200, "application/json", std::move(out), {}};
}

net::HttpResponse Coordinator::clear_node(const std::string& name, const Caller& caller) {
  auto cleared = ledger_.clear_node(name, caller.user, clock_.read());
  flush_effects();
  if (!cleared) return error_response(cleared.error().code() == ErrorCode::NotFound ? 404 : 409, cleared.error().message());
  Json list = Json::array();
  for (const auto& [id, attempt] : *cleared) list.push_back(Json{{"id", id}, {"attempt", attempt}});
  return json_response(200, Json{{"node", name}, {"cleared", list}});
}

net::HttpResponse Coordinator::drain_node(const std::string& name, const net::HttpRequest& request, bool drain) {
  std::string reason;
  if (drain) {
    auto body = protocol::parse_json(request.body.empty() ? "{}" : request.body, 64 * 1024);
    if (!body) return error_response(400, body.error().message());
    protocol::JsonReader r(*body);
    reason = r.str("reason", 1024);
    if (r.ok() && reason.empty()) r.fail("reason", "must not be empty");
    if (!r.ok()) return error_response(400, r.error());
  }
  auto ok = ledger_.set_drained(name, drain, reason, clock_.read());
  flush_effects();
  if (!ok) return error_response(ok.error().code() == ErrorCode::NotFound ? 404 : 400, ok.error().message());
  bool connected = ledger_.connected(name);
  NodeView v;
  v.node = ledger_.scheduler().node(name);
  v.connected = connected;
  link_view(name, clock_.read(), v);
  for (const auto& g : v.node->gpus) v.holders.push_back(ledger_.scheduler().gpu_holder(name, g.index));
  return json_response(200, node_json(v));
}

namespace {

// A label value as the text format wants it: backslash, quote and newline escaped.
std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// name="value",name="value"
std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> pairs) {
  std::string out;
  for (const auto& [k, v] : pairs) {
    if (!out.empty()) out += ",";
    out += std::string(k) + "=\"" + label_value(v) + "\"";
  }
  return out;
}

}  // namespace

net::HttpResponse Coordinator::metrics(const Caller* caller) {
  // Who ran what is private data where jobs or usage are: only an admin's scrape (a token
  // on /metrics) gets the per-user series; everyone else gets the totals.
  const bool per_user = !(config_.private_data.jobs || config_.private_data.usage) || (caller != nullptr && caller->admin);
  std::string out;
  auto family = [&out](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto line = [&out](const std::string& name, const std::string& label_text, double value) {
    out += name;
    if (!label_text.empty()) out += "{" + label_text + "}";
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.17g\n", value);
    out += buf;
  };
  const auto& scheduler = ledger_.scheduler();

  family("corral_build_info", "gauge", "The coordinator's version (always 1).");
  line("corral_build_info", labels({{"version", version()}}), 1);

  family("corral_jobs", "gauge", "Live jobs by state (ended jobs are in corral_jobs_ended_total).");
  int by_state[model::kJobStateCount] = {};
  std::map<std::string, int> pending_by_reason;
  for (const auto& [id, job] : ledger_.live_jobs()) {
    ++by_state[static_cast<int>(job.record.state)];
    if (job.record.state == JobState::Pending) {
      const auto* sj = scheduler.job(id);
      ++pending_by_reason[sj ? std::string(sched::to_string(sj->reason.code)) : "None"];
    }
  }
  for (JobState s : {JobState::Pending, JobState::Starting, JobState::Running, JobState::Ending}) {
    line("corral_jobs", labels({{"state", model::to_string(s)}}), by_state[static_cast<int>(s)]);
  }
  family("corral_jobs_pending", "gauge", "Pending jobs by the reason they wait.");
  for (sched::PendingCode code : {sched::PendingCode::Resources, sched::PendingCode::Priority,
                                  sched::PendingCode::NoHomogeneousSet, sched::PendingCode::NodeDown,
                                  sched::PendingCode::Drained, sched::PendingCode::Dependency,
                                  sched::PendingCode::JobArrayTaskLimit}) {
    const std::string reason(sched::to_string(code));
    line("corral_jobs_pending", labels({{"reason", reason}}), pending_by_reason[reason]);
  }
  family("corral_jobs_submitted_total", "counter", "Jobs accepted since the coordinator started.");
  line("corral_jobs_submitted_total", "", static_cast<double>(ledger_.stats().submitted));
  if (per_user) {
    family("corral_jobs_ended_total", "counter", "Jobs ended since the coordinator started, by end state and user.");
    for (const auto& [key, n] : ledger_.stats().ended_by_user) {
      line("corral_jobs_ended_total", labels({{"state", model::to_string(key.first)}, {"user", key.second}}),
           static_cast<double>(n));
    }
  } else {
    family("corral_jobs_ended_total", "counter", "Jobs ended since the coordinator started, by end state.");
    std::map<JobState, std::uint64_t> by_end;
    for (const auto& [key, n] : ledger_.stats().ended_by_user) by_end[key.first] += n;
    for (const auto& [state, n] : by_end) {
      line("corral_jobs_ended_total", labels({{"state", model::to_string(state)}}), static_cast<double>(n));
    }
  }
  family("corral_job_queue_wait_seconds", "histogram", "From submission to first start, by the GPU class it got.");
  for (const auto& [cls, h] : ledger_.stats().queue_wait_by_class) {
    out += h.render("corral_job_queue_wait_seconds", labels({{"class", cls}}));
  }
  family("corral_job_run_seconds", "histogram", "From the last start to the end, of jobs that ended.");
  out += ledger_.stats().run_seconds.render("corral_job_run_seconds", "");

  family("corral_nodes", "gauge", "Nodes by state.");
  int up = 0, down = 0, drained = 0;
  for (const auto* n : scheduler.nodes()) (n->state == model::NodeState::Up ? up : n->state == model::NodeState::Down ? down : drained)++;
  line("corral_nodes", labels({{"state", "up"}}), up);
  line("corral_nodes", labels({{"state", "down"}}), down);
  line("corral_nodes", labels({{"state", "drained"}}), drained);
  family("corral_node_up", "gauge", "1 when the node is up (its agent connected, not drained), else 0.");
  for (const auto* n : scheduler.nodes()) line("corral_node_up", labels({{"node", n->name}}), n->state == model::NodeState::Up);
  family("corral_agent_last_heartbeat_seconds", "gauge",
         "Unix time of the last message from the node's agent (time() minus it: how long it has been silent).");
  const Now now = clock_.read();
  for (const auto* n : scheduler.nodes()) {
    if (const auto* link = ledger_.link(n->name)) {
      line("corral_agent_last_heartbeat_seconds", labels({{"node", n->name}}),
           static_cast<double>(to_millis(now.date_of(link->last_seen))) / 1000.0);
    }
  }
  family("corral_gpus", "gauge", "GPUs by node, class and state: allocated (held by a job), free, drained, down.");
  std::map<std::string, int> by_user;
  for (const auto* n : scheduler.nodes()) {
    std::map<std::pair<std::string, std::string>, int> counts;  // (class, state)
    for (const auto& g : n->gpus) {
      std::string state = n->state == model::NodeState::Down ? "down" : n->state == model::NodeState::Drained ? "drained" : "free";
      if (auto holder = scheduler.gpu_holder(n->name, g.index)) {
        state = "allocated";
        if (const Job* j = ledger_.any_job(*holder)) ++by_user[j->record.user];
      }
      ++counts[{g.cls.product, state}];
    }
    std::set<std::string> classes;
    for (const auto& g : n->gpus) classes.insert(g.cls.product);
    for (const auto& cls : classes) {
      for (const char* state : {"allocated", "free", "drained", "down"}) {
        line("corral_gpus", labels({{"node", n->name}, {"class", cls}, {"state", state}}), counts[{cls, state}]);
      }
    }
  }
  if (per_user) {
    family("corral_gpus_allocated_by_user", "gauge", "GPUs held by each user's jobs.");
    for (const auto& [user, n] : by_user) line("corral_gpus_allocated_by_user", labels({{"user", user}}), n);
  }

  family("corral_scheduler_passes_total", "counter", "Scheduling passes run.");
  line("corral_scheduler_passes_total", "", static_cast<double>(stats_.passes));
  family("corral_scheduler_last_pass_seconds", "gauge", "How long the last scheduling pass took.");
  line("corral_scheduler_last_pass_seconds", "", stats_.last_pass_ms / 1000.0);
  family("corral_store_batches_total", "counter", "SQLite transactions committed (each one sync).");
  line("corral_store_batches_total", "", static_cast<double>(committer_.batches()));
  family("corral_store_changes_total", "counter", "State changes committed (several per transaction under load).");
  line("corral_store_changes_total", "", static_cast<double>(committer_.committed()));
  family("corral_store_changes_folded_total", "counter",
         "Job changes folded into the same job's change before them in a transaction (one write for both).");
  line("corral_store_changes_folded_total", "", static_cast<double>(committer_.folded()));
  family("corral_store_failing", "gauge",
         "1 while the database refuses writes (disk full, read-only, I/O error): writes get 503, reports wait.");
  line("corral_store_failing", "", committer_.failing() ? 1 : 0);
  family("corral_store_failures_total", "counter", "Times the database began refusing writes.");
  line("corral_store_failures_total", "", static_cast<double>(stats_.store_failures));
  family("corral_store_retries_total", "counter", "Transactions the database refused whole, kept and tried again.");
  line("corral_store_retries_total", "", static_cast<double>(committer_.retries()));
  family("corral_store_commit_seconds", "histogram", "How long each SQLite transaction, sync included, took.");
  out += committer_.commit_seconds().render("corral_store_commit_seconds", "");
  family("corral_agent_messages_total", "counter", "Messages received from agents.");
  line("corral_agent_messages_total", "", static_cast<double>(stats_.agent_messages));
  family("corral_agent_messages_rejected_total", "counter", "Agent messages refused as malformed.");
  line("corral_agent_messages_rejected_total", "", static_cast<double>(stats_.bad_agent_messages));
  family("corral_http_requests_total", "counter", "HTTP requests received.");
  line("corral_http_requests_total", "", static_cast<double>(stats_.http_requests));
  return {200, "text/plain; version=0.0.4", out, {}};
}

}  // namespace corral::service
