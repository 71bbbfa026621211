#pragma once
// Where and with what environment a job was submitted, as sbatch keeps them: the
// directory `corral submit` ran in (the job's workdir unless the spec names one) and the
// submitting shell's environment (`--export`, the spec's `export:`). The CLI collects
// them; the coordinator checks them, stores them with the job and hands them to every
// rank. Pure functions: no process environment is read here.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/core/error.hpp"

namespace corral::model {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Sets `name` in `env`, replacing its value where it is there already (its place kept).
void set_env(EnvList& env, const std::string& name, std::string value);
bool has_env(const EnvList& env, std::string_view name);

// Which variables of the submitting shell travel with the job: all (sbatch's default,
// --export=ALL), none (--export=NONE), or the named ones.
struct ExportChoice {
  bool all = true;
  std::vector<std::string> names;  // when !all: these only (empty: none)

  bool operator==(const ExportChoice&) const = default;
};

struct Submission {
  std::string dir;  // absolute; empty when unknown (a job submitted through the API alone)
  EnvList env;      // the exported variables, sorted by name

  bool operator==(const Submission&) const = default;
};

// At most this many exported variables, and bytes of names and values in all.
inline constexpr std::size_t kMaxExportedVariables = 1024;
inline constexpr std::size_t kMaxExportedBytes = 128 * 1024;

// "ALL", "NONE" (in any case), or names separated by commas ("HF_HOME,PYTHONPATH"). InvalidArgument
// naming `field` for anything else.
Result<ExportChoice> parse_export_choice(std::string_view text, std::string_view field);

// Whether a variable of the submitting shell may travel with a job: never corral's own
// (CORRAL_*, among them the token), nor what corral sets for every rank, nor the shell's
// bookkeeping (PWD, OLDPWD, SHLVL, _), nor a name that is not [A-Za-z_][A-Za-z0-9_]*
// (exported shell functions).
bool travels(std::string_view name);

// The variables of `environ` that `choice` exports and that travel, sorted by name.
// InvalidArgument, naming `field`, beyond the limits above.
Result<EnvList> exported_environment(const ExportChoice& choice, const EnvList& environ, std::string_view field);

// The coordinator's check of what a client sent: `dir` absolute (or empty), every name
// one that travels, within the limits. InvalidArgument naming the field.
Result<void> check_submission(const Submission& submission);

}  // namespace corral::model
