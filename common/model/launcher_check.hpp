#pragma once
// A launcher in a job's command: torchrun, srun and their kind start processes of their
// own, while corral already starts the job's processes (one per GPU by default) and gives
// each torchrun's variables. A script written for torchrun or sbatch, submitted as it is,
// would start a launcher in every process. Said as a warning; the job is still submitted.

#include <optional>
#include <string>

#include "common/model/job_spec.hpp"

namespace corral::model {

// What to tell the person submitting `spec`, or nothing when its command starts no
// launcher that would multiply its processes.
std::optional<std::string> launcher_warning(const JobSpec& spec);

}  // namespace corral::model
