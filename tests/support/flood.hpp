#pragma once
// A hostile client for tests: holds many connections to a server, from several loopback
// source addresses, each either silent (TCP only) or stopped halfway through a TLS
// handshake (the first bytes of a ClientHello, then nothing). When the server closes one
// it is opened again, at a bounded rate, so the flood stays as large as the server lets
// it be for as long as it runs.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace corral::testing {

class Flood {
 public:
  struct Options {
    int port = 0;
    std::vector<std::string> sources;  // 127.0.0.X addresses to connect from, in turn
    int idle = 0;                      // silent TCP connections
    int half_open = 0;                 // connections stopped in the TLS handshake
    int reopen_per_second = 1000;
  };

  explicit Flood(Options options) : options_(std::move(options)), epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    for (int i = 0; i < options_.idle + options_.half_open; ++i) open_one(i, i >= options_.idle);
    thread_ = std::thread([this] { watch(); });
  }
  ~Flood() {
    stop_ = true;
    thread_.join();
    for (const auto& [fd, kind] : open_) ::close(fd);
    ::close(epoll_);
  }
  Flood(const Flood&) = delete;
  Flood& operator=(const Flood&) = delete;

  int opened() const { return opened_; }         // connections made so far
  int closed_by_server() const { return closed_; }
  int failed() const { return failed_; }         // connects that did not succeed

 private:
  // Opens connection `index` (its source address and kind follow from it).
  bool open_one(int index, bool half_open) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ++failed_, false;
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, options_.sources[static_cast<std::size_t>(index) % options_.sources.size()].c_str(),
                &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(options_.port));
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      ::close(fd);
      return ++failed_, false;
    }
    if (half_open) {
      // A TLS record header announcing 512 bytes of ClientHello, and its first bytes only.
      static const unsigned char kHello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
                                             0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a};
      (void)!::send(fd, kHello, sizeof(kHello), MSG_NOSIGNAL);
    }
    epoll_event ev{};
    ev.events = EPOLLRDHUP | EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
    open_[fd] = {index, half_open};
    ++opened_;
    return true;
  }

  void watch() {
    std::vector<std::pair<int, bool>> to_open;
    auto window = std::chrono::steady_clock::now();
    int budget = options_.reopen_per_second / 10;
    epoll_event events[256];
    while (!stop_) {
      int n = ::epoll_wait(epoll_, events, 256, 10);
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        auto it = open_.find(fd);
        if (it == open_.end()) continue;
        // The server sends nothing to these: readable means closed.
        ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        to_open.push_back(it->second);
        open_.erase(it);
        ++closed_;
      }
      auto now = std::chrono::steady_clock::now();
      if (now - window >= std::chrono::milliseconds(100)) {
        window = now;
        budget = options_.reopen_per_second / 10;
      }
      while (!to_open.empty() && budget > 0) {
        open_one(to_open.back().first, to_open.back().second);
        to_open.pop_back();
        --budget;
      }
    }
  }

  Options options_;
  int epoll_;
  std::map<int, std::pair<int, bool>> open_;  // fd -> (index, half_open)
  std::atomic<int> opened_{0};
  std::atomic<int> closed_{0};
  std::atomic<int> failed_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace corral::testing
