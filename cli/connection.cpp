#include "cli/connection.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/model/client_config_yaml.hpp"

namespace corral::cli {

namespace {

// Reads at most the config limit (and one byte more, to notice a larger file).
Result<std::string> read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::InvalidArgument, "cannot read " + path + ": " + std::strerror(errno));
  std::string text(model::kMaxClientConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return make_error(ErrorCode::InvalidArgument, "cannot read " + path);
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > model::kMaxClientConfigBytes) {
    return make_error(
        ErrorCode::InvalidArgument,
        path + ": larger than the limit of " + std::to_string(model::kMaxClientConfigBytes) + " bytes");
  }
  return text;
}

// "~/x" is expanded because YAML, unlike a shell, would keep the tilde.
std::string resolve_ca(const std::string& ca, const std::string& config_path, const EnvLookup& env) {
  if (ca.starts_with("~/")) {
    if (auto home = env_value(env, "HOME")) return (std::filesystem::path(*home) / ca.substr(2)).string();
    return ca;
  }
  std::filesystem::path p(ca);
  if (p.is_absolute()) return ca;
  return (std::filesystem::path(config_path).parent_path() / p).lexically_normal().string();
}

}  // namespace

std::optional<std::string> env_value(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  return v;
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string default_config_path(const EnvLookup& env) {
  if (auto xdg = env_value(env, "XDG_CONFIG_HOME")) {
    return (std::filesystem::path(*xdg) / "corral" / "config.yaml").string();
  }
  if (auto home = env_value(env, "HOME")) {
    return (std::filesystem::path(*home) / ".config" / "corral" / "config.yaml").string();
  }
  return {};
}

std::string user_config_dir(const EnvLookup& env) {
  auto file = default_config_path(env);
  return file.empty() ? std::string() : std::filesystem::path(file).parent_path().string();
}

Result<ConnectionSettings> load_connection_settings(const std::optional<std::string>& config_file,
                                                    const EnvLookup& env) {
  ConnectionSettings s;
  std::string path = config_file.value_or(default_config_path(env));
  bool must_exist = config_file.has_value();
  std::error_code ec;
  if (!path.empty() && (must_exist || std::filesystem::exists(path, ec))) {
    auto text = read_config_file(path);
    if (!text) return std::unexpected(text.error());
    auto parsed = model::parse_client_config(*text, path);
    if (!parsed) return std::unexpected(parsed.error());
    s.url = parsed->url;
    s.token = parsed->token;
    if (!parsed->ca.empty()) s.ca = resolve_ca(parsed->ca, path, env);
  }
  if (auto v = env_value(env, "CORRAL_URL")) s.url = *v;
  if (auto v = env_value(env, "CORRAL_TOKEN")) s.token = *v;
  if (auto v = env_value(env, "CORRAL_CA")) s.ca = *v;
  if (auto dir = user_config_dir(env); !dir.empty()) s.session_file = dir + "/tls-session";

  std::vector<std::string> missing;
  if (s.url.empty()) missing.push_back("url (CORRAL_URL)");
  if (s.token.empty()) missing.push_back("token (CORRAL_TOKEN)");
  // The local socket (unix:/PATH) is plain HTTP: no certificate to verify.
  if (s.ca.empty() && !s.url.starts_with("unix:")) missing.push_back("ca (CORRAL_CA)");
  if (!missing.empty()) {
    std::string message = "not configured: missing";
    for (std::size_t i = 0; i < missing.size(); ++i) message += (i == 0 ? " " : ", ") + missing[i];
    message += path.empty() ? std::string("; set the variables or pass --config FILE")
                            : "; set the variables or write " + path;
    return make_error(ErrorCode::InvalidArgument, message);
  }
  return s;
}

}  // namespace corral::cli
