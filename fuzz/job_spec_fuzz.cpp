// The job spec parser: any bytes give a spec or an error, never a crash or a hang; a
// spec that parses once parses the same again (no hidden state).
#include <cstdlib>

#include "common/model/job_spec_yaml.hpp"
#include "fuzz/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto yaml = corral::fuzz::text(data, size);
  auto first = corral::model::parse_job_spec(yaml, "job.yaml");
  auto second = corral::model::parse_job_spec(yaml, "job.yaml");
  if (first.has_value() != second.has_value()) std::abort();
  if (!first && first.error().message().empty()) std::abort();  // every refusal says why
  return 0;
}
