#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "common/core/strings.hpp"
#include "common/model/config.hpp"

namespace corral::model {

namespace {

// Reads one flat YAML map of scalars with a handler per key; collects every problem.
class FlatConfig {
 public:
  using Handler = std::function<std::string(const std::string& value)>;  // "" or a problem

  FlatConfig(std::string_view file) : file_(file) {}

  void key(std::string name, Handler h) {
    names_.push_back(name);
    handlers_.emplace(std::move(name), std::move(h));
  }

  Result<void> parse(std::string_view text) {
    if (text.size() > 256 * 1024) return make_error(ErrorCode::InvalidArgument, file_ + ": file too large");
    YAML::Node root;
    try {
      root = YAML::Load(std::string(text));
    } catch (const YAML::Exception& e) {
      return make_error(ErrorCode::InvalidArgument,
                        file_ + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                            ": " + e.msg);
    }
    if (!root.IsMap()) return make_error(ErrorCode::InvalidArgument, file_ + ": must be a map of settings");
    std::vector<std::string_view> known(names_.begin(), names_.end());
    std::map<std::string, bool> seen;
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Mark mark = it->first.Mark();
      std::string where = file_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1) + ": ";
      std::string name = it->first.IsScalar() ? it->first.Scalar() : std::string("?");
      auto h = handlers_.find(name);
      if (h == handlers_.end()) {
        std::string msg = where + name + ": unknown setting";
        if (auto near = closest_match(name, known)) msg += "; did you mean \"" + std::string(*near) + "\"?";
        problems_.push_back(msg);
        continue;
      }
      if (seen[name]) {
        problems_.push_back(where + name + ": set twice");
        continue;
      }
      seen[name] = true;
      if (!it->second.IsScalar()) {
        const YAML::Mark vm = it->second.Mark();
        problems_.push_back(file_ + ":" + std::to_string(vm.line + 1) + ":" + std::to_string(vm.column + 1) + ": " +
                            name + ": must be a single value");
        continue;
      }
      const YAML::Mark vm = it->second.Mark();
      std::string problem = h->second(it->second.Scalar());
      if (!problem.empty()) {
        problems_.push_back(file_ + ":" + std::to_string(vm.line + 1) + ":" + std::to_string(vm.column + 1) + ": " +
                            name + ": " + problem);
      }
    }
    for (const auto& req : required_) {
      if (!seen[req]) problems_.push_back(file_ + ": " + req + ": required setting is missing");
    }
    if (!problems_.empty()) {
      std::string all;
      for (const auto& p : problems_) all += (all.empty() ? "" : "\n") + p;
      return make_error(ErrorCode::InvalidArgument, all);
    }
    return {};
  }

  void require(std::string name) { required_.push_back(std::move(name)); }

 private:
  std::string file_;
  std::vector<std::string> names_;
  std::map<std::string, Handler> handlers_;
  std::vector<std::string> required_;
  std::vector<std::string> problems_;
};

FlatConfig::Handler duration_into(Duration& out) {
  return [&out](const std::string& v) -> std::string {
    auto d = parse_duration(v);
    if (!d) return d.error().message();
    out = *d;
    return "";
  };
}

FlatConfig::Handler string_into(std::string& out, bool allow_empty = false) {
  return [&out, allow_empty](const std::string& v) -> std::string {
    if (v.empty() && !allow_empty) return "must not be empty";
    if (v.size() > 4096) return "longer than 4096 characters";
    out = v;
    return "";
  };
}

FlatConfig::Handler bool_into(bool& out) {
  return [&out](const std::string& v) -> std::string {
    if (v == "true" || v == "yes" || v == "on") {
      out = true;
    } else if (v == "false" || v == "no" || v == "off") {
      out = false;
    } else {
      return "must be true or false, got " + quote_for_message(v);
    }
    return "";
  };
}

template <typename T>
FlatConfig::Handler int_into(T& out, long long min, long long max) {
  return [&out, min, max](const std::string& v) -> std::string {
    auto parsed = parse_int<long long>(v);
    long long x = parsed.value_or(0);
    if (!parsed || x < min || x > max) {
      return "must be an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got " +
             quote_for_message(v);
    }
    out = static_cast<T>(x);
    return "";
  };
}

// "host:port", "[v6]:port" or ":port".
std::string parse_listen(const std::string& v, std::string& host, int& port) {
  auto colon = v.rfind(':');
  if (colon == std::string::npos) return "must be HOST:PORT, got " + quote_for_message(v);
  std::string h = v.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p = 0;
  if (auto e = int_into(p, 0, 65535)(v.substr(colon + 1)); !e.empty()) return "port " + e;
  host = h.empty() ? "0.0.0.0" : h;
  port = p;
  return "";
}

std::string parse_ports(const std::string& v, PortRange& out) {
  auto dash = v.find('-');
  if (dash == std::string::npos) return "must be FIRST-LAST, got " + quote_for_message(v);
  int first = 0;
  int last = 0;
  if (!int_into(first, 1, 65535)(v.substr(0, dash)).empty() || !int_into(last, 1, 65535)(v.substr(dash + 1)).empty() ||
      first > last) {
    return "must be FIRST-LAST with 1 <= FIRST <= LAST <= 65535, got " + quote_for_message(v);
  }
  out = {first, last};
  return "";
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::NotFound, "cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || p.front() == '/') return p;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

}  // namespace

Result<CoordinatorConfig> parse_coordinator_config(std::string_view yaml, std::string_view file_name) {
  CoordinatorConfig c;
  FlatConfig f(file_name);
  f.key("listen", [&c](const std::string& v) { return parse_listen(v, c.listen_host, c.listen_port); });
  f.key("state_dir", string_into(c.state_dir));
  f.key("database", string_into(c.database));
  f.key("heartbeat_interval", duration_into(c.heartbeat_interval));
  f.key("node_timeout", duration_into(c.node_timeout));
  f.key("reconnect_grace", duration_into(c.reconnect_grace));
  f.key("kill_grace", duration_into(c.kill_grace));
  f.key("schedule_interval", duration_into(c.schedule_interval));
  f.key("fair_share_half_life", duration_into(c.fair_share_half_life));
  f.key("max_connections", int_into(c.max_connections, 1, 100000));
  f.key("max_connections_per_address", int_into(c.max_connections_per_address, 1, 100000));
  f.key("max_request_bytes", int_into(c.max_request_bytes, 1024, 64LL * 1024 * 1024));
  f.key("public_status", bool_into(c.public_status));
  if (auto r = f.parse(yaml); !r) return std::unexpected(r.error());
  if (c.node_timeout <= c.heartbeat_interval) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string(file_name) + ": node_timeout must be longer than heartbeat_interval");
  }
  return c;
}

Result<AgentConfig> parse_agent_config(std::string_view yaml, std::string_view file_name) {
  AgentConfig c;
  FlatConfig f(file_name);
  f.key("node", [&c](const std::string& v) -> std::string {
    if (v.empty() || v.size() > 64 || v.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != std::string::npos) {
      return "must be 1 to 64 of [A-Za-z0-9._-], got " + quote_for_message(v);
    }
    c.node = v;
    return "";
  });
  f.key("coordinator", [&c](const std::string& v) -> std::string {
    if (v.rfind("https://", 0) != 0) return "must be an https://HOST:PORT URL, got " + quote_for_message(v);
    c.coordinator = v;
    return "";
  });
  f.key("ca", string_into(c.ca));
  f.key("cert", string_into(c.cert));
  f.key("key", string_into(c.key));
  f.key("spool", string_into(c.spool));
  f.key("advertise", string_into(c.advertise));
  f.key("ports", [&c](const std::string& v) { return parse_ports(v, c.ports); });
  f.key("simulate", string_into(c.simulate, true));
  f.key("allow_root_jobs", bool_into(c.allow_root_jobs));
  f.key("nvidia_smi", string_into(c.nvidia_smi));
  f.key("worker", string_into(c.worker));
  f.key("preflight_interval", duration_into(c.preflight_interval));
  f.key("reconnect_max_backoff", duration_into(c.reconnect_max_backoff));
  for (const char* req : {"node", "coordinator", "ca", "cert", "key", "advertise"}) f.require(req);
  if (auto r = f.parse(yaml); !r) return std::unexpected(r.error());
  return c;
}

Result<CoordinatorConfig> load_coordinator_config(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::unexpected(text.error());
  auto c = parse_coordinator_config(*text, path);
  if (!c) return c;
  std::string dir = std::filesystem::path(path).parent_path().string();
  c->state_dir = resolve(dir, c->state_dir);
  c->database = resolve(dir, c->database);
  return c;
}

Result<AgentConfig> load_agent_config(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::unexpected(text.error());
  auto c = parse_agent_config(*text, path);
  if (!c) return c;
  std::string dir = std::filesystem::path(path).parent_path().string();
  for (std::string* p : {&c->ca, &c->cert, &c->key, &c->spool, &c->simulate}) *p = resolve(dir, *p);
  return c;
}

}  // namespace corral::model
