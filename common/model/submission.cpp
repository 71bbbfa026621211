#include "common/model/submission.hpp"

#include <algorithm>
#include <array>
#include <cctype>

#include "common/model/job_spec_text.hpp"

namespace corral::model {

namespace {

constexpr std::array<std::string_view, 4> kShellBookkeeping = {"PWD", "OLDPWD", "SHLVL", "_"};

Error invalid(std::string_view field, const std::string& message) {
  return Error(ErrorCode::InvalidArgument, std::string(field) + ": " + message);
}

Result<void> check_size(const EnvList& env, std::string_view field) {
  if (env.size() > kMaxExportedVariables) {
    return std::unexpected(invalid(field, std::to_string(env.size()) + " variables to export; at most " +
                                              std::to_string(kMaxExportedVariables) +
                                              ": name the ones the job needs (--export=VAR,...) or --export=NONE"));
  }
  std::size_t bytes = 0;
  for (const auto& [k, v] : env) bytes += k.size() + v.size();
  if (bytes > kMaxExportedBytes) {
    return std::unexpected(invalid(field, "the variables to export hold " + std::to_string(bytes) + " bytes; at most " +
                                              std::to_string(kMaxExportedBytes) +
                                              ": name the ones the job needs (--export=VAR,...) or --export=NONE"));
  }
  return {};
}

}  // namespace

void set_env(EnvList& env, const std::string& name, std::string value) {
  auto it = std::find_if(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
  if (it != env.end()) {
    it->second = std::move(value);
  } else {
    env.emplace_back(name, std::move(value));
  }
}

bool has_env(const EnvList& env, std::string_view name) {
  return std::any_of(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
}

Result<ExportChoice> parse_export_choice(std::string_view text, std::string_view field) {
  auto is = [&](std::string_view word) {
    return text.size() == word.size() && std::equal(text.begin(), text.end(), word.begin(), [](char a, char b) {
             return std::toupper(static_cast<unsigned char>(a)) == b;
           });
  };
  if (is("ALL")) return ExportChoice{};  // as sbatch, in any case
  if (is("NONE")) return ExportChoice{false, {}};
  ExportChoice choice{false, {}};
  std::size_t at = 0;
  while (at <= text.size()) {
    std::size_t comma = std::min(text.find(',', at), text.size());
    std::string_view name = text.substr(at, comma - at);
    if (!spec_text::valid_env_name(name)) {
      return std::unexpected(invalid(field, "must be ALL, NONE or variable names separated by commas, got " +
                                                spec_text::path_component(text)));
    }
    choice.names.emplace_back(name);
    at = comma + 1;
  }
  return choice;
}

bool travels(std::string_view name) {
  if (!spec_text::valid_env_name(name) || spec_text::reserved_env_problem(name)) return false;
  return std::find(kShellBookkeeping.begin(), kShellBookkeeping.end(), name) == kShellBookkeeping.end();
}

Result<EnvList> exported_environment(const ExportChoice& choice, const EnvList& environ, std::string_view field) {
  EnvList out;
  for (const auto& [k, v] : environ) {
    if (!travels(k)) continue;
    if (!choice.all && std::find(choice.names.begin(), choice.names.end(), k) == choice.names.end()) continue;
    out.emplace_back(k, v);
  }
  // By name; of a name given twice the first wins, as with getenv.
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out.erase(std::unique(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
            out.end());
  if (auto ok = check_size(out, field); !ok) return std::unexpected(ok.error());
  return out;
}

Result<void> check_submission(const Submission& submission) {
  if (!submission.dir.empty()) {
    if (submission.dir.front() != '/') return std::unexpected(invalid("submit_dir", "must be an absolute path"));
    if (submission.dir.size() > 4096) return std::unexpected(invalid("submit_dir", "longer than 4096 bytes"));
    if (submission.dir.find('\0') != std::string::npos) {
      return std::unexpected(invalid("submit_dir", "must not hold a NUL character"));
    }
  }
  for (std::size_t i = 0; i < submission.env.size(); ++i) {
    const auto& [k, v] = submission.env[i];
    std::string field = "environment[" + std::to_string(i) + "]";
    if (!travels(k)) {
      return std::unexpected(invalid(field, "variable " + spec_text::path_component(k) +
                                                " cannot travel with a job (corral sets it, or it is no variable name)"));
    }
    if (v.find('\0') != std::string::npos) return std::unexpected(invalid(field, "must not hold a NUL character"));
  }
  return check_size(submission.env, "environment");
}

}  // namespace corral::model
