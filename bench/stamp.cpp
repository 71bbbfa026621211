// stamp DIR: writes the wall-clock time (ns since the epoch) at which this process got
// to run into DIR/$RANK.t. The rank command of bench/launch_latency.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

int main(int argc, char** argv) {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  if (argc != 2) {
    std::fprintf(stderr, "usage: stamp DIR\n");
    return 2;
  }
  const char* rank = std::getenv("RANK");
  std::string path = std::string(argv[1]) + "/" + (rank != nullptr ? rank : "x") + ".t";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    return 1;
  }
  std::fprintf(f, "%lld\n", static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec);
  return std::fclose(f) == 0 ? 0 : 1;
}
