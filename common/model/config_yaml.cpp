#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "common/core/strings.hpp"
#include "common/model/config.hpp"
#include "common/model/flat_config.hpp"

namespace corral::model {

namespace {

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

std::string parse_private_data(const std::vector<std::string>& items, PrivateData& out) {
  PrivateData p;
  for (const auto& item : items) {
    if (item == "history") {
      p.history = true;
    } else if (item == "usage") {
      p.usage = true;
    } else if (item == "jobs") {
      p.jobs = true;
    } else {
      return "unknown item " + quote_for_message(item) + "; use history, usage or jobs";
    }
  }
  out = p;
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

// A size in bytes: a number, or one with KiB, MiB or GiB after it.
FlatConfig::Handler bytes_into(std::uint64_t& out, std::uint64_t min, std::uint64_t max, std::string_view range) {
  return [&out, min, max, range](const std::string& v) -> std::string {
    const std::string problem = "must be a size from " + std::string(range) +
                                " (bytes, or a number with KiB, MiB or GiB), got " + quote_for_message(v);
    std::size_t digits = v.find_first_not_of("0123456789");
    if (digits == 0 || v.size() > 24) return problem;
    std::string_view unit = std::string_view(v).substr(digits == std::string::npos ? v.size() : digits);
    if (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    std::uint64_t scale = 0;
    if (unit.empty()) scale = 1;
    else if (unit == "KiB") scale = std::uint64_t{1} << 10;
    else if (unit == "MiB") scale = std::uint64_t{1} << 20;
    else if (unit == "GiB") scale = std::uint64_t{1} << 30;
    else return problem;
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i) {
      if (n > max) return problem;
      n = n * 10 + static_cast<std::uint64_t>(v[i] - '0');
    }
    if (n > max / scale || n * scale < min || n * scale > max) return problem;
    out = n * scale;
    return "";
  };
}

}  // namespace

Result<CoordinatorConfig> parse_coordinator_config(std::string_view yaml, std::string_view file_name) {
  CoordinatorConfig c;
  FlatConfig f(file_name);
  f.key("listen", [&c](const std::string& v) { return parse_listen(v, c.listen_host, c.listen_port); });
  f.key("state_dir", string_into(c.state_dir));
  f.key("database", string_into(c.database));
  f.key("local_socket", string_into(c.local_socket));
  f.key("heartbeat_interval", duration_into(c.heartbeat_interval));
  f.key("node_timeout", duration_into(c.node_timeout));
  bool lost_timeout_set = false;
  f.key("node_lost_timeout", [&c, &lost_timeout_set](const std::string& v) {
    lost_timeout_set = true;
    return duration_into(c.node_lost_timeout)(v);
  });
  f.key("reconnect_grace", duration_into(c.reconnect_grace));
  f.key("kill_grace", duration_into(c.kill_grace));
  f.key("schedule_interval", duration_into(c.schedule_interval));
  f.key("fair_share_half_life", duration_into(c.fair_share_half_life));
  f.key("max_connections", int_into(c.max_connections, 1, 100000));
  f.key("max_connections_per_address", int_into(c.max_connections_per_address, 1, 100000));
  f.key("max_request_bytes", int_into(c.max_request_bytes, 1024, 64LL * 1024 * 1024));
  f.key("public_status", bool_into(c.public_status));
  f.list_key("private_data", [&c](const std::vector<std::string>& items) { return parse_private_data(items, c.private_data); });
  if (auto r = f.parse(yaml); !r) return std::unexpected(r.error());
  if (c.node_timeout <= c.heartbeat_interval) {
    return make_error(ErrorCode::InvalidArgument,
                      std::string(file_name) + ": node_timeout must be longer than heartbeat_interval");
  }
  // Left out, it follows a node_timeout set longer than its default.
  if (!lost_timeout_set) c.node_lost_timeout = std::max(c.node_lost_timeout, c.node_timeout);
  if (c.node_lost_timeout < c.node_timeout) {
    return make_error(ErrorCode::InvalidArgument, std::string(file_name) + ": node_lost_timeout (" +
                                                      format_duration(c.node_lost_timeout) +
                                                      ") must be at least node_timeout (" +
                                                      format_duration(c.node_timeout) + ")");
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
  f.key("rank_log_cap", bytes_into(c.rank_log_cap, std::uint64_t{64} << 10, std::uint64_t{1} << 40, "64KiB to 1024GiB"));
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
  c->local_socket = resolve(dir, c->local_socket);
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
