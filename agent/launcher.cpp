#include "agent/launcher.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "common/core/inherited_fds.hpp"

namespace corral::agent {

namespace {

UserIds user_ids(const passwd& pw) {
  return UserIds{pw.pw_name ? pw.pw_name : "", pw.pw_uid, pw.pw_gid, pw.pw_dir ? pw.pw_dir : "/",
                 pw.pw_shell && *pw.pw_shell ? pw.pw_shell : "/bin/sh"};
}

}  // namespace

Result<UserIds> lookup_user(const std::string& name) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  int rc = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
  if (rc != 0 || found == nullptr) return make_error(ErrorCode::NotFound, "no such user " + name + " on this node");
  return user_ids(pw);
}

Result<UserIds> lookup_user_id(uid_t uid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  int rc = getpwuid_r(uid, &pw, buf.data(), buf.size(), &found);
  if (rc != 0 || found == nullptr) return make_error(ErrorCode::NotFound, "no user with uid " + std::to_string(uid));
  return user_ids(pw);
}

namespace {

// In the child: report `what: strerror(errno)` to the parent and exit.
[[noreturn]] void child_fail(int fd, const char* what) {
  int err = errno;
  char msg[4096];
  int n = std::snprintf(msg, sizeof(msg), "%s: %s", what, std::strerror(err));
  if (n > 0) (void)!::write(fd, msg, static_cast<std::size_t>(std::min(n, static_cast<int>(sizeof(msg)) - 1)));
  ::_exit(127);
}

// In the child: report `message` as it is and exit.
[[noreturn]] void child_fail_with(int fd, const std::string& message) {
  (void)!::write(fd, message.data(), message.size());
  ::_exit(127);
}

std::string env_path(const std::vector<std::string>& envp) {
  for (const auto& e : envp) {
    if (e.starts_with("PATH=")) return e.substr(5);
  }
  return {};
}

// Where exec would look for `program`, in order: itself when it names a path, else each
// PATH entry (an empty one is the working directory).
std::vector<std::string> program_candidates(const std::string& program, const std::string& path) {
  if (program.find('/') != std::string::npos) return {program};
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= path.size()) {
    std::size_t colon = std::min(path.find(':', at), path.size());
    std::string dir = path.substr(at, colon - at);
    out.push_back(dir.empty() ? program : dir + "/" + program);
    at = colon + 1;
  }
  return out;
}

bool executable_file(const std::string& file) {
  struct stat st {};
  return ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(file.c_str(), X_OK) == 0;
}

constexpr std::string_view kShellWords[] = {
    "!", ".", ":", "[", "[[", "{", "alias", "break", "case", "cd", "command", "continue", "echo", "eval",
    "exec", "exit", "export", "false", "for", "function", "getopts", "hash", "if", "kill", "local", "printf",
    "pwd", "read", "readonly", "return", "set", "shift", "source", "test", "time", "times", "trap", "true",
    "type", "ulimit", "umask", "unalias", "unset", "until", "wait", "while"};

}  // namespace

std::string find_program(const std::string& program, const std::string& path) {
  for (const auto& file : program_candidates(program, path)) {
    if (executable_file(file)) return file;
  }
  return {};
}

std::string shell_program(std::string_view command) {
  std::size_t start = command.find_first_not_of(" \t");
  if (start == std::string_view::npos) return {};
  std::size_t end = command.find_first_of(" \t\n;&|", start);
  std::string_view word = command.substr(start, (end == std::string_view::npos ? command.size() : end) - start);
  if (word.empty() || word.find_first_of("$`'\"\\<>(){}*?[]=~#!") != std::string_view::npos) return {};
  if (std::find(std::begin(kShellWords), std::end(kShellWords), word) != std::end(kShellWords)) return {};
  return std::string(word);
}

Result<pid_t> spawn(const ProcessSpec& spec) {
  if (spec.argv.empty()) return make_error(ErrorCode::InvalidArgument, "empty command");
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::string workdir = spec.workdir;
  if (workdir.empty()) workdir = !spec.home.empty() ? spec.home : spec.user ? spec.user->home : "";
  std::string chdir_what = spec.workdir.empty() ? "home directory " + workdir + " (the job sets no workdir)"
                                                : "workdir " + workdir;
  std::string log_what = "open log " + spec.log_path;
  std::string exec_what = "exec " + spec.argv.front();
  // exec looks programs up on the job's PATH, not the agent's: decided here, before the
  // fork, so the child only tries the candidates.
  std::string path = env_path(spec.envp);
  if (path.empty()) path = kLoginPath;
  const std::string& program = spec.require_program.empty() ? spec.argv.front() : spec.require_program;
  const std::vector<std::string> candidates = program_candidates(program, path);
  const std::string not_found = "command not found: " + program + " (PATH=" + path + ")";

  const InheritedFds inherited;
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return make_error(ErrorCode::Internal, std::string("pipe: ") + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(report[0]);
    ::close(report[1]);
    return make_error(ErrorCode::Unavailable, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(report[0]);
    ::setpgid(0, 0);
    // Signals the agent handles or ignores must not leak into the job.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    int log = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (log < 0) child_fail(report[1], log_what.c_str());
    int in = spec.stdin_fd >= 0 ? spec.stdin_fd : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0) child_fail(report[1], "open /dev/null");
    if (::dup2(in, 0) < 0 || ::dup2(spec.stdout_fd >= 0 ? spec.stdout_fd : log, 1) < 0 || ::dup2(log, 2) < 0) {
      child_fail(report[1], "dup2");
    }
    if (spec.user) {
      // The log stays writable: it was opened before privileges were dropped.
      if (::fchown(log, spec.user->uid, spec.user->gid) != 0) {
        // Not fatal: the job can still write through the open descriptor.
      }
    }
    // Nothing of the agent reaches the job: only 0-2, and the report pipe until exec
    // closes it (close-on-exec).
    inherited.close_all_but(report[1]);
    if (spec.user) {
      if (::setgid(spec.user->gid) != 0) child_fail(report[1], "setgid");
      if (::initgroups(spec.user->name.c_str(), spec.user->gid) != 0) child_fail(report[1], "initgroups");
      if (::setuid(spec.user->uid) != 0) child_fail(report[1], "setuid");
    }
    if (!workdir.empty() && ::chdir(workdir.c_str()) != 0) child_fail(report[1], chdir_what.c_str());
    // As the user, in the workdir: what it may run from there.
    if (std::none_of(candidates.begin(), candidates.end(), executable_file)) child_fail_with(report[1], not_found);
    if (spec.require_program.empty()) {
      for (const auto& file : candidates) {
        if (!executable_file(file)) continue;
        ::execve(file.c_str(), argv.data(), envp.data());
        if (errno == ENOEXEC) {
          // A script without a #! line: as execvp does, /bin/sh runs it.
          std::vector<char*> sh{const_cast<char*>("/bin/sh"), const_cast<char*>(file.c_str())};
          sh.insert(sh.end(), argv.begin() + 1, argv.end());
          ::execve("/bin/sh", sh.data(), envp.data());
        }
        break;
      }
    } else {
      ::execve(argv[0], argv.data(), envp.data());  // the shell, by its path
    }
    child_fail(report[1], exec_what.c_str());
  }
  ::close(report[1]);
  // Also set it from the parent: whichever runs first, the group exists before we
  // might signal it.
  ::setpgid(pid, pid);
  std::string why;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(report[0], buf, sizeof(buf));
    if (n > 0) {
      why.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  ::close(report[0]);
  if (!why.empty()) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return make_error(ErrorCode::InvalidArgument, why);
  }
  return pid;
}

bool signal_group(pid_t pgid, int signal) { return pgid > 0 && ::kill(-pgid, signal) == 0; }

bool group_alive(pid_t pgid) { return pgid > 0 && (::kill(-pgid, 0) == 0 || errno == EPERM); }

std::vector<pid_t> attempt_processes(long long job, int attempt, const std::string& agent_id, const std::string& proc) {
  const std::string want_job = "CORRAL_JOB_ID=" + std::to_string(job);
  const std::string want_attempt = "CORRAL_ATTEMPT=" + std::to_string(attempt);
  const std::string want_agent = std::string(kAgentIdVariable) + "=" + agent_id;
  std::vector<pid_t> out;
  DIR* dir = ::opendir(proc.c_str());
  if (dir == nullptr) return out;
  pid_t self = ::getpid();
  std::string env;
  char buf[16384];
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == self) continue;
    int fd = ::open((proc + "/" + e->d_name + "/environ").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // gone meanwhile, or a kernel thread
    env.clear();
    // Environments are bounded by ARG_MAX; read it all.
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      env.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    bool has_job = false;
    bool has_attempt = false;
    bool has_agent = false;
    for (std::size_t at = 0; at < env.size();) {
      std::size_t nul = env.find('\0', at);
      if (nul == std::string::npos) nul = env.size();
      std::string_view entry(env.data() + at, nul - at);
      has_job = has_job || entry == want_job;
      has_attempt = has_attempt || entry == want_attempt;
      has_agent = has_agent || entry == want_agent;
      at = nul + 1;
    }
    if (has_job && has_attempt && has_agent) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

std::string process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return {};
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return {};
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return {};
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

}  // namespace corral::agent
