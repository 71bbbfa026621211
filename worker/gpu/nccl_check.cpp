// nccl-check: one NCCL communicator over the job's ranks, built from the distributed
// CORRAL_NCCL_UNIQUE_ID; then a float sum all-reduce over a range of sizes, every element
// checked, and timed the way nccl-tests' all_reduce_perf reports it:
//   algbw = bytes / time,  busbw = algbw * 2 (n - 1) / n.
// The communicator is non-blocking so that every wait has a deadline: a rank that never
// arrives, or dies mid-collective, ends in a timeout instead of a hang.

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <poll.h>
#include <unistd.h>

#include "common/core/strings.hpp"
#include "worker/commands.hpp"
#include "worker/exit_codes.hpp"
#include "worker/flags.hpp"
#include "worker/gpu/gpu_status.hpp"
#include "worker/hex.hpp"
#include "worker/json_line.hpp"
#include "worker/rank_env.hpp"

namespace corral::worker {

namespace {

using gpu::cuda_step;
using gpu::GpuResult;
using gpu::nccl_step;
using gpu::Step;
using SteadyClock = std::chrono::steady_clock;

constexpr std::string_view kKnownFlags[] = {"timeout", "iters", "warmup", "max-bytes"};
// The pattern's period: sums stay small whole numbers, exact in float for any world size
// corral allows (4096 * 4097 / 2 + 4096 * 12 < 2^24).
constexpr int kPatternPeriod = 13;

struct Settings {
  Duration timeout = std::chrono::seconds(120);
  int iters = 20;
  int warmup = 5;
  std::size_t max_bytes = std::size_t{64} << 20;
};

struct SizeResult {
  std::size_t bytes = 0;
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::string wrong;  // empty when every element was right
};

// Aborts the communicator on every path out, unless finish() ended it cleanly.
class Communicator {
 public:
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  explicit Communicator(Duration timeout) : timeout_(timeout) {}
  ~Communicator() {
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  }

  Step init(int world_size, const NcclUniqueIdBytes& id_bytes, int rank) {
    ncclUniqueId id{};
    static_assert(sizeof(id.internal) == kNcclUniqueIdBytes);
    std::memcpy(id.internal, id_bytes.data(), id_bytes.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return wait(ncclCommInitRankConfig(&comm_, world_size, id, rank, &config), "ncclCommInitRankConfig");
  }

  // For an NCCL call on this communicator: waits out ncclInProgress, up to the deadline.
  Step wait(ncclResult_t status, std::string_view call) {
    auto deadline = SteadyClock::now() + timeout_;
    while (status == ncclInProgress) {
      if (SteadyClock::now() > deadline) return timed_out(call);
      ::poll(nullptr, 0, 1);
      CORRAL_GPU_TRY(nccl_step(ncclCommGetAsyncError(comm_, &status), "ncclCommGetAsyncError", comm_));
    }
    return nccl_step(status, call, comm_);
  }

  // cudaStreamSynchronize with a deadline, which also notices NCCL's asynchronous
  // errors (a peer gone) instead of waiting on a kernel that will never finish.
  Step synchronize(cudaStream_t stream, std::string_view what) {
    auto deadline = SteadyClock::now() + timeout_;
    for (;;) {
      cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaSuccess) return {};
      if (status != cudaErrorNotReady) return cuda_step(status, what);
      ncclResult_t async = ncclSuccess;
      CORRAL_GPU_TRY(nccl_step(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_));
      if (async != ncclSuccess && async != ncclInProgress) return nccl_step(async, what, comm_);
      if (SteadyClock::now() > deadline) return timed_out(what);
      ::poll(nullptr, 0, 1);
    }
  }

  Step finish() {
    CORRAL_GPU_TRY(wait(ncclCommFinalize(comm_), "ncclCommFinalize"));
    Step destroyed = nccl_step(ncclCommDestroy(comm_), "ncclCommDestroy");
    comm_ = nullptr;
    return destroyed;
  }

  ncclComm_t get() const { return comm_; }

 private:
  std::unexpected<Failure> timed_out(std::string_view what) const {
    return std::unexpected(
        Failure{ExitCode::RendezvousTimeout, std::string(what) + " did not finish within " +
                                                 format_duration(timeout_) + " (a rank missing, or stuck)"});
  }

  Duration timeout_;
  ncclComm_t comm_ = nullptr;
};

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Step create() {
    return cuda_step(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  Step create() { return cuda_step(cudaEventCreate(&event_), "cudaEventCreate"); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// 8 B, then x8 up to max_bytes, which is always the last size.
std::vector<std::size_t> sizes_up_to(std::size_t max_bytes) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = 8; b < max_bytes; b *= 8) sizes.push_back(b);
  sizes.push_back(max_bytes);
  return sizes;
}

GpuResult<int> pick_device(const RankEnv& env) {
  auto count = gpu::count_visible_devices();
  if (!count) return std::unexpected(count.error());
  // One GPU visible (gpu_visibility: rank): it is device 0 whatever LOCAL_RANK says. Several:
  // the torchrun habit of indexing them with LOCAL_RANK.
  if (*count == 1) return 0;
  if (env.local_rank >= *count) {
    return std::unexpected(Failure{ExitCode::BadEnvironment, "LOCAL_RANK=" + std::to_string(env.local_rank) +
                                                                 " but only " + std::to_string(*count) +
                                                                 " devices are visible"});
  }
  return env.local_rank;
}

GpuResult<std::vector<SizeResult>> run_sizes(const RankEnv& env, const NcclUniqueIdBytes& id,
                                             const Settings& settings, int device, JsonLine& json) {
  CORRAL_GPU_TRY(cuda_step(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  cudaDeviceProp props{};
  CORRAL_GPU_TRY(cuda_step(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties"));
  json.add("device", device).add("device_name", props.name);

  const std::size_t max_count = settings.max_bytes / sizeof(float);
  gpu::DeviceMemory send;
  gpu::DeviceMemory recv;
  CORRAL_GPU_TRY(send.allocate(max_count * sizeof(float), "the send buffer"));
  CORRAL_GPU_TRY(recv.allocate(max_count * sizeof(float), "the receive buffer"));
  Stream stream;
  CORRAL_GPU_TRY(stream.create());
  Event start;
  Event stop;
  CORRAL_GPU_TRY(start.create());
  CORRAL_GPU_TRY(stop.create());

  // Element i of rank r is r + 1 + i % 13, so the sum is exact and position-dependent:
  // a shifted, truncated or stale result cannot pass.
  std::vector<float> host(max_count);
  for (std::size_t i = 0; i < max_count; ++i) {
    host[i] = static_cast<float>(env.rank + 1 + static_cast<int>(i % kPatternPeriod));
  }
  // On our stream and waited for: a plain cudaMemcpy from pageable memory may return
  // before its DMA lands, and a non-blocking stream would not wait for it.
  CORRAL_GPU_TRY(cuda_step(cudaMemcpyAsync(send.as<float>(), host.data(), max_count * sizeof(float),
                                           cudaMemcpyHostToDevice, stream.get()),
                           "cudaMemcpyAsync of the send pattern"));
  CORRAL_GPU_TRY(cuda_step(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize"));

  Communicator comm(settings.timeout);
  CORRAL_GPU_TRY(comm.init(env.world_size, id, env.rank));

  const double world = env.world_size;
  const double base = world * (world + 1) / 2;
  std::vector<SizeResult> results;
  auto all_reduce = [&](std::size_t count) {
    return comm.wait(ncclAllReduce(send.as<float>(), recv.as<float>(), count, ncclFloat, ncclSum, comm.get(),
                                   stream.get()),
                     "ncclAllReduce(" + std::to_string(count * sizeof(float)) + " bytes)");
  };
  for (std::size_t bytes : sizes_up_to(settings.max_bytes)) {
    const std::size_t count = bytes / sizeof(float);
    SizeResult r;
    r.bytes = bytes;
    // NaN everywhere first, so that elements the all-reduce never wrote are caught.
    CORRAL_GPU_TRY(
        cuda_step(cudaMemsetAsync(recv.as<float>(), 0xff, bytes, stream.get()), "cudaMemsetAsync"));
    CORRAL_GPU_TRY(all_reduce(count));
    CORRAL_GPU_TRY(comm.synchronize(stream.get(), "the checked all-reduce"));
    CORRAL_GPU_TRY(cuda_step(cudaMemcpy(host.data(), recv.as<float>(), bytes, cudaMemcpyDeviceToHost),
                             "cudaMemcpy of the result"));
    for (std::size_t i = 0; i < count; ++i) {
      const double want = base + world * static_cast<double>(i % kPatternPeriod);
      if (static_cast<double>(host[i]) != want) {
        r.wrong = "element " + std::to_string(i) + " of " + std::to_string(count) + " is " +
                  std::to_string(host[i]) + ", not " + std::to_string(want);
        break;
      }
    }
    // Every rank runs the same collectives whatever it found, so none is left waiting.
    for (int i = 0; i < settings.warmup; ++i) CORRAL_GPU_TRY(all_reduce(count));
    CORRAL_GPU_TRY(cuda_step(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord"));
    for (int i = 0; i < settings.iters; ++i) CORRAL_GPU_TRY(all_reduce(count));
    CORRAL_GPU_TRY(cuda_step(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord"));
    CORRAL_GPU_TRY(comm.synchronize(stream.get(), "the timed all-reduces"));
    float ms = 0;
    CORRAL_GPU_TRY(cuda_step(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
    const double seconds = static_cast<double>(ms) / 1e3 / settings.iters;
    r.time_us = seconds * 1e6;
    r.algbw_gbps = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
    r.busbw_gbps = r.algbw_gbps * 2 * (world - 1) / world;
    results.push_back(std::move(r));
  }
  CORRAL_GPU_TRY(comm.finish());
  return results;
}

int report(JsonLine& json, const std::optional<Failure>& failure, std::optional<int> rank) {
  return print_result(json, rank ? "nccl-check: rank " + std::to_string(*rank) + ": " : "nccl-check: ", failure);
}

GpuResult<Settings> parse_settings(std::span<const std::string> args) {
  auto usage = [](const Error& e) { return std::unexpected(Failure{ExitCode::Usage, e.message()}); };
  auto flags = parse_flags(args, kKnownFlags);
  if (!flags) return usage(flags.error());
  Settings s;
  if (auto it = flags->find("timeout"); it != flags->end()) {
    auto v = parse_timeout("timeout", it->second);
    if (!v) return usage(v.error());
    s.timeout = *v;
  }
  if (auto it = flags->find("iters"); it != flags->end()) {
    auto v = parse_integer("iters", it->second, 1, 10000);
    if (!v) return usage(v.error());
    s.iters = static_cast<int>(*v);
  }
  if (auto it = flags->find("warmup"); it != flags->end()) {
    auto v = parse_integer("warmup", it->second, 0, 1000);
    if (!v) return usage(v.error());
    s.warmup = static_cast<int>(*v);
  }
  if (auto it = flags->find("max-bytes"); it != flags->end()) {
    auto v = parse_integer("max-bytes", it->second, 8, std::int64_t{4} << 30);
    if (!v) return usage(v.error());
    s.max_bytes = static_cast<std::size_t>(*v) / sizeof(float) * sizeof(float);
  }
  return s;
}

}  // namespace

int run_nccl_check(std::span<const std::string> args) {
  JsonLine json;
  json.add("check", "nccl");
  auto settings = parse_settings(args);
  if (!settings) return report(json.add_null("rank"), settings.error(), std::nullopt);

  EnvMap process_env = read_process_env();
  auto env = parse_rank_env(process_env);
  if (!env)
    return report(json.add_null("rank"), Failure{ExitCode::BadEnvironment, env.error().message()},
                  std::nullopt);
  json.add("rank", env->rank)
      .add("world_size", env->world_size)
      .add("local_rank", env->local_rank)
      .add("node_rank", env->node_rank)
      .add("job_id", env->job_id)
      .add("attempt", env->attempt)
      .add("hostname", host_name())
      .add("cuda_visible_devices", env->cuda_visible_devices);
  int version = 0;
  if (auto s = nccl_step(ncclGetVersion(&version), "ncclGetVersion"); !s)
    return report(json, s.error(), env->rank);
  json.add("nccl_version", std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) +
                               "." + std::to_string(version % 100));

  auto id_text = process_env.find(std::string_view("CORRAL_NCCL_UNIQUE_ID"));
  if (id_text == process_env.end() || id_text->second.empty()) {
    return report(json, Failure{ExitCode::BadEnvironment, "missing environment: CORRAL_NCCL_UNIQUE_ID"},
                  env->rank);
  }
  auto id = decode_nccl_unique_id(id_text->second);
  if (!id) return report(json, Failure{ExitCode::BadEnvironment, id.error().message()}, env->rank);

  auto device = pick_device(*env);
  if (!device) return report(json, device.error(), env->rank);
  auto results = run_sizes(*env, *id, *settings, *device, json);
  if (!results) return report(json, results.error(), env->rank);

  std::string rows = "[";
  std::optional<Failure> wrong;
  for (const SizeResult& r : *results) {
    JsonLine row;
    row.add("bytes", std::uint64_t{r.bytes})
        .add("count", std::uint64_t{r.bytes / sizeof(float)})
        .add("time_us", r.time_us, 2)
        .add("algbw_gbps", r.algbw_gbps, 2)
        .add("busbw_gbps", r.busbw_gbps, 2)
        .add("correct", r.wrong.empty());
    if (!r.wrong.empty() && !wrong) {
      wrong =
          Failure{ExitCode::WrongResult, "all-reduce of " + std::to_string(r.bytes) + " bytes: " + r.wrong};
    }
    rows += (rows.size() > 1 ? "," : "") + row.str();
  }
  json.add_raw("results", rows + "]");
  return report(json, wrong, env->rank);
}

}  // namespace corral::worker
