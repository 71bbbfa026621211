#include "agent/spool.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "agent/launcher.hpp"
#include "common/core/fd.hpp"
#include "common/core/files.hpp"

namespace corral::agent {

namespace fs = std::filesystem;

std::string Spool::attempt_dir(model::JobId job, int attempt) const {
  return root_ + "/jobs/" + std::to_string(job) + "/" + std::to_string(attempt);
}

std::string Spool::log_path(model::JobId job, int attempt, int rank) const {
  return attempt_dir(job, attempt) + "/rank-" + std::to_string(rank) + ".log";
}

std::string Spool::marker_name(model::JobId job, int attempt, int rank) {
  return std::to_string(job) + "-" + std::to_string(attempt) + "-" + std::to_string(rank);
}

std::string Spool::marker_path(model::JobId job, int attempt, int rank) const {
  return root_ + "/running/" + marker_name(job, attempt, rank);
}

void Spool::forget(const std::string& marker) const {
  std::error_code ec;
  fs::remove(root_ + "/running/" + marker, ec);
}

Result<void> Spool::create() const {
  for (const char* sub : {"/jobs", "/running"}) {
    std::error_code ec;
    fs::create_directories(root_ + sub, ec);
    if (ec) return make_error(ErrorCode::Unavailable, "cannot create spool " + root_ + sub + ": " + ec.message());
  }
  return {};
}

Result<void> Spool::create_log(model::JobId job, int attempt, int rank) const {
  const std::string path = log_path(job, attempt, rank);
  auto refused = [&](int err) {
    return make_error(ErrorCode::ResourceExhausted,
                      "the spool " + root_ + " cannot take the log " + path + ": " + std::strerror(err));
  };
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640));
  if (!fd) return refused(errno);
  // A block reserved without changing the size: an empty file can be made on a full file
  // system (an inode is enough), its first write cannot.
  if (::fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 0, 4096) == 0) return {};
  if (errno != EOPNOTSUPP && errno != ENOSYS) return refused(errno);
  if (std::string why = full(); !why.empty()) {
    return make_error(ErrorCode::ResourceExhausted, "cannot take the log " + path + ": " + why);
  }
  return {};
}

std::string Spool::full() const {
  struct statvfs st {};
  if (::statvfs(root_.c_str(), &st) != 0) return "the spool " + root_ + " cannot be read: " + std::strerror(errno);
  // f_bavail: what users other than root may still write; ranks run as those users.
  const std::uint64_t free = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
  if (free >= kMinFree) return "";
  return "the spool " + root_ + " is full (" + std::to_string(free) + " bytes free)";
}

Result<std::string> Spool::agent_id() const {
  std::string path = root_ + "/agent-id";
  std::string id;
  std::ifstream(path) >> id;
  if (id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos) return id;
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  id = buf;
  if (auto w = write_file_atomically(path, id + "\n", 0644); !w) return std::unexpected(w.error());
  return id;
}

void Spool::mark_running(model::JobId job, int attempt, int rank, pid_t pid,
                         const std::vector<std::string>& gpu_uuids) const {
  // Replaced whole: an agent SIGKILLed while writing it leaves the old marker or the new
  // one, never an empty one that has lost the rank's pid and GPUs. (A reboot ends the
  // ranks, so it is not synced.)
  std::string text = std::to_string(pid) + " " + (pid > 0 ? process_start_time(pid) : "-");
  for (const auto& uuid : gpu_uuids) text += " " + uuid;
  (void)write_file_atomically(marker_path(job, attempt, rank), text + "\n", 0644, Survives::kill);
}

void Spool::record_exit(const protocol::RankExited& m) const {
  std::ofstream(log_path(m.job, m.attempt, m.rank) + ".exit")
      << m.exit_code << " " << m.signal << " " << (m.launch_failure ? 1 : 0) << " " << m.ended_at_ms << "\n"
      << m.reason << "\n";
}

bool Spool::started_before(model::JobId job, int attempt, int rank) const {
  std::error_code ec;
  return fs::exists(log_path(job, attempt, rank), ec);
}

std::optional<protocol::RankExited> Spool::recorded_exit(model::JobId job, int attempt, int rank) const {
  std::ifstream in(log_path(job, attempt, rank) + ".exit");
  protocol::RankExited m{job, attempt, rank, 0, 0, "", false};
  std::string first;
  if (!std::getline(in, first)) return std::nullopt;
  // "CODE SIGNAL [LAUNCH_FAILURE [ENDED_AT_MS]]": older agents wrote fewer fields.
  std::istringstream fields(first);
  int launch_failure = 0;
  if (!(fields >> m.exit_code >> m.signal)) return std::nullopt;
  if (fields >> launch_failure) m.launch_failure = launch_failure != 0;
  std::int64_t ended_at_ms = 0;
  if (fields >> ended_at_ms && ended_at_ms > 0) m.ended_at_ms = ended_at_ms;
  std::getline(in >> std::ws, m.reason);
  return m;
}

protocol::RankExited Spool::ended_before(model::JobId job, int attempt, int rank) const {
  return recorded_exit(job, attempt, rank)
      .value_or(protocol::RankExited{
          job, attempt, rank, -1, 0,
          "started on this node before and not running now; its end is unknown (the agent restarted)",
          false});
}

std::vector<Spool::Leftover> Spool::leftovers() const {
  std::vector<Leftover> left;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_ + "/running", ec)) {
    Leftover l;
    l.marker = entry.path().filename().string();
    std::ifstream in(entry.path());
    in >> l.pid >> l.start_time;
    for (std::string uuid; in >> uuid;) l.gpu_uuids.push_back(uuid);
    long long job = 0;
    char rest = 0;
    l.named = std::sscanf(l.marker.c_str(), "%lld-%d-%d%c", &job, &l.attempt, &l.rank, &rest) == 3 && job > 0;
    l.job = job;
    left.push_back(std::move(l));
  }
  return left;
}

}  // namespace corral::agent
