#pragma once
// Files that another process reads (certificates, keys, the port file, the agent's id)
// are replaced whole: written to a temporary file beside them, synced, then renamed over
// them, so a reader sees the old file or the new one, never half of one.

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/core/error.hpp"

namespace corral {

// What a rename must survive: a crash of the machine (synced first), or only the writer
// being killed (files that mean nothing after a reboot, on a path where an fsync would
// cost, such as a rank's marker written as it starts).
enum class Survives { crash, kill };

// Unavailable naming `path` and the system's reason when it cannot be written.
[[nodiscard]] Result<void> write_file_atomically(const std::string& path, std::string_view content, mode_t mode,
                                                 Survives survives = Survives::crash);

}  // namespace corral
