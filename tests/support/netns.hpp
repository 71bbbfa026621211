#pragma once
// Test support: a lab network of hosts, one network namespace each, every host joined by
// a veth pair to one bridge in the test's own namespace, all in one private /24 that no
// other lab on the machine uses at the same time (parallel test processes each make
// their own). The bridge holds .1, host i holds .(10 + i); nothing is routed anywhere
// else. The destructor removes every namespace and link it made; a lab also removes what
// test processes that died before cleaning up left behind (names carry the pid).
// Needs root and iproute2; `error()` says why a lab could not be made.

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/core/fd.hpp"
#include "tests/support/process.hpp"

namespace corral::testing {

struct NetnsHost {
  std::string ns;         // the network namespace (`ip netns exec NS ...`)
  std::string interface;  // the host's interface inside its namespace
  std::string link;       // the other end of its veth pair, on the bridge in the test's namespace
  std::string address;    // its IPv4 address in the lab subnet
};

class NetnsLab {
 public:
  static constexpr const char* kNamespacePrefix = "corral-e2e-";
  static constexpr const char* kLinkPrefix = "ce2e";  // link names are at most 15 characters

  // Makes `hosts` namespaces on one bridge. On failure error() says which step failed and
  // why; whatever was made by then is removed again by the destructor.
  explicit NetnsLab(int hosts) : pid_(::getpid()) {
    if (::geteuid() != 0) {
      error_ = "network namespaces need root (running as uid " + std::to_string(::geteuid()) + ")";
      return;
    }
    bridge_ = kLinkPrefix + std::to_string(pid_) + "b";
    {
      // One process at a time picks a subnet and claims it by giving the bridge its .1.
      UniqueFd lock(::open((std::filesystem::temp_directory_path() / "corral-e2e-netns.lock").c_str(),
                           O_RDWR | O_CREAT | O_CLOEXEC, 0600));
      if (lock) ::flock(lock.get(), LOCK_EX);
      remove_leftovers();
      int subnet = free_subnet();
      if (subnet < 0) {
        error_ = "no free 10.231.X.0/24 subnet for the lab";
        return;
      }
      prefix_ = "10.231." + std::to_string(subnet) + ".";
      if (!ip({"link", "add", bridge_, "type", "bridge"})) return;
      made_bridge_ = true;
      if (!ip({"addr", "add", prefix_ + "1/24", "dev", bridge_}) || !ip({"link", "set", bridge_, "up"}))
        return;
    }
    for (int i = 0; i < hosts; ++i) {
      NetnsHost h;
      h.ns = kNamespacePrefix + std::to_string(pid_) + "-h" + std::to_string(i);
      h.interface = "eth" + std::to_string(i);
      h.link = kLinkPrefix + std::to_string(pid_) + "v" + std::to_string(i);
      h.address = prefix_ + std::to_string(10 + i);
      if (!ip({"netns", "add", h.ns})) return;
      hosts_.push_back(h);
      if (!ip({"link", "add", h.link, "type", "veth", "peer", "name", h.interface, "netns", h.ns})) return;
      links_.push_back(h.link);
      if (!ip({"link", "set", h.link, "master", bridge_}) || !ip({"link", "set", h.link, "up"}) ||
          !ip({"-n", h.ns, "link", "set", "lo", "up"}) ||
          !ip({"-n", h.ns, "addr", "add", h.address + "/24", "dev", h.interface}) ||
          !ip({"-n", h.ns, "link", "set", h.interface, "up"})) {
        return;
      }
    }
    ok_ = true;
  }

  ~NetnsLab() {
    // Whatever still runs in the lab (ranks whose agent was killed) goes first: a
    // namespace lives on as long as a process is in it.
    for (const auto& h : hosts_) kill_processes_in(h.ns);
    for (const auto& link : links_) ip({"link", "del", link});  // takes the peer in the namespace with it
    for (const auto& h : hosts_) ip({"netns", "del", h.ns});
    if (made_bridge_) ip({"link", "del", bridge_});
  }

  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  const NetnsHost& host(int i) const { return hosts_.at(static_cast<std::size_t>(i)); }
  int hosts() const { return static_cast<int>(hosts_.size()); }
  // The test's own address on the bridge: how it reaches the hosts.
  std::string bridge_address() const { return prefix_ + "1"; }
  const std::string& bridge() const { return bridge_; }
  // The argv prefix that runs a program on host i.
  std::vector<std::string> exec(int i) const { return {"ip", "netns", "exec", host(i).ns}; }

  // Cuts host i off the bridge (its veth end on the bridge goes down), and puts it back.
  bool cut(int i) { return ip({"link", "set", host(i).link, "down"}); }
  bool restore(int i) { return ip({"link", "set", host(i).link, "up"}); }

  // The inode of host i's network namespace, as /proc/PID/ns/net shows it.
  ino_t namespace_inode(int i) const {
    struct stat st {};
    return ::stat(("/var/run/netns/" + host(i).ns).c_str(), &st) == 0 ? st.st_ino : 0;
  }

  // A TCP socket listening on host i's address and `port`, made by a thread that enters
  // the host's namespace: a process foreign to whatever runs there holds that port.
  UniqueFd listen_on(int i, int port) const {
    UniqueFd fd;
    std::string path = "/var/run/netns/" + host(i).ns;
    std::string address = host(i).address;
    std::thread([&] {
      UniqueFd ns(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) return;
      UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in sin{};
      sin.sin_family = AF_INET;
      sin.sin_port = htons(static_cast<std::uint16_t>(port));
      ::inet_pton(AF_INET, address.c_str(), &sin.sin_addr);
      if (s && ::bind(s.get(), reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) == 0 &&
          ::listen(s.get(), 16) == 0) {
        fd = std::move(s);
      }
    }).join();
    return fd;
  }

  // Names of namespaces and links of this kind on the machine (any lab's, live or not).
  static std::vector<std::string> namespaces() {
    std::vector<std::string> out;
    std::istringstream in(ip_output({"netns", "list"}));
    for (std::string line; std::getline(in, line);) {
      std::string name = line.substr(0, line.find(' '));
      if (name.rfind(kNamespacePrefix, 0) == 0) out.push_back(name);
    }
    return out;
  }
  static std::vector<std::string> links() {
    std::vector<std::string> out;
    std::istringstream in(ip_output({"-o", "link", "show"}));
    for (std::string line; std::getline(in, line);) {
      // "12: ce2e4242v1@if2: <BROADCAST,..."
      auto start = line.find(": ");
      if (start == std::string::npos) continue;
      start += 2;
      std::string name = line.substr(start, line.find_first_of("@:", start) - start);
      if (name.rfind(kLinkPrefix, 0) == 0) out.push_back(name);
    }
    return out;
  }

 private:
  // Runs `ip ARGS`; on failure the first failure is kept in error_.
  bool ip(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"ip"};
    argv.insert(argv.end(), args.begin(), args.end());
    Child c;
    if (!c.start(argv)) {
      if (error_.empty()) error_ = "cannot start ip";
      return false;
    }
    c.read_stdout();
    int status = c.wait();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    if (error_.empty()) {
      error_ = "`";
      for (const auto& a : argv) error_ += (a == argv.front() ? "" : " ") + a;
      error_ += "` failed";
      if (WIFEXITED(status) && WEXITSTATUS(status) == 127) error_ += " (is iproute2 installed?)";
      for (const auto& line : c.lines()) error_ += ": " + line;
    }
    return false;
  }

  static std::string ip_output(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"ip"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv).second;
  }

  // The pid in a name made by a lab, or 0.
  static pid_t owner(const std::string& name, const std::string& prefix) {
    std::size_t end = prefix.size();
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == prefix.size()) return 0;
    return static_cast<pid_t>(std::stol(name.substr(prefix.size(), end - prefix.size())));
  }

  static bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

  static void kill_processes_in(const std::string& ns) {
    std::istringstream in(ip_output({"netns", "pids", ns}));
    for (pid_t pid = 0; in >> pid;) {
      if (pid > 0 && pid != ::getpid()) ::kill(pid, SIGKILL);
    }
  }

  // Labs of test processes that are gone (killed by a timeout, crashed) left these.
  void remove_leftovers() {
    for (const auto& link : links()) {
      pid_t pid = owner(link, kLinkPrefix);
      if (pid > 0 && !alive(pid)) ip({"link", "del", link});
    }
    for (const auto& ns : namespaces()) {
      pid_t pid = owner(ns, kNamespacePrefix);
      if (pid > 0 && !alive(pid)) {
        kill_processes_in(ns);
        ip({"netns", "del", ns});
      }
    }
    error_.clear();  // a leftover that vanished meanwhile is no failure of this lab
  }

  // A third octet no address or route of the test's namespace uses, starting from one
  // that depends on the pid so that parallel labs rarely look at the same ones.
  int free_subnet() const {
    std::string used =
        ip_output({"-o", "-4", "addr", "show"}) + ip_output({"-4", "route", "show", "table", "all"});
    for (int k = 0; k < 256; ++k) {
      int x = (static_cast<int>(pid_) + k) % 256;
      if (used.find("10.231." + std::to_string(x) + ".") == std::string::npos) return x;
    }
    return -1;
  }

  pid_t pid_;
  bool ok_ = false;
  bool made_bridge_ = false;
  std::string error_;
  std::string prefix_;
  std::string bridge_;
  std::vector<NetnsHost> hosts_;
  std::vector<std::string> links_;
};

}  // namespace corral::testing
