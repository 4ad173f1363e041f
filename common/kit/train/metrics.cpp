// kit/train/metrics.cpp — metrics.csv, progress lines and the ranks' epoch reports (see metrics.h).
#include "kit/train/metrics.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "kit/compat.h"
#include "kit/runtime/distributed.h"
#include "kit/runtime/files.h"
#include "kit/train/checkpoint.h"  // Checkpoints::kStopPollSteps: rows are written at polling steps
#include "kit/train/memory.h"
#include "kit/check/observe.h"

namespace kit {
namespace {

constexpr const char* kHeader =
    "step,epoch,loss,samples_per_s,ranks,elapsed_s,rank,device,host,peak_mem_mib,gpu_busy_pct\n";
constexpr int kRanksListed = 16;  // more ranks than this: one summary line instead of one each

// A resumed run (from the checkpoint after step `last`) continues metrics.csv. A run that was
// killed (node failure, SIGKILL) may have written rows after its last checkpoint, which the
// resumed run does again, and its very last line may be cut off: keep the header and the
// complete rows of steps 1..last only, so that every step appears exactly once.
void keep_rows_up_to(const std::string& path, int64_t last) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  std::string kept = kHeader;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = text.substr(at, nl + 1 - at);
    char* end = nullptr;
    const long long step = std::strtoll(line.c_str(), &end, 10);
    if (end != line.c_str() && *end == ',' && step >= 1 && step <= last) kept += line;
  }
  if (kept != text) write_atomically(path, kept, "metrics");
}

// What one rank sends to rank 0 at an epoch's end: plain bytes, gathered with one all_gather.
struct RankReport {
  double samples_per_s;  // NaN: this rank did no training step of the epoch in this run
  double peak_mem_mib;   // GPU: caching allocator's peak; CPU: peak resident memory
  double gpu_busy_pct;   // -1: not known (CPU, or no NVML)
  int32_t cuda;          // 1: device is cuda:index
  int32_t index;
  char host[48];
};

// The node's name as the scheduler knows it (Slurm's, which is also what `squeue` shows), else
// the host name.
void node_name(char* out, size_t size) {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm && *slurm) {
    std::snprintf(out, size, "%s", slurm);
  } else if (gethostname(out, size) != 0) {
    std::snprintf(out, size, "?");
  }
  out[size - 1] = '\0';
}

double peak_host_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

// How busy the GPU was over NVML's last sample period (1/6 s to 1 s, by GPU), or -1. NVML comes
// with the driver (libnvidia-ml.so.1); it is opened at run time, so the kit needs neither its
// header nor the library to build, and a node without it simply reports no figure.
double gpu_busy_pct(const std::string& pci_bus_id) {
  using Init = int (*)();
  using ByBus = int (*)(const char*, void**);
  using Utilization = int (*)(void*, unsigned int*);  // nvmlUtilization_t: {gpu, memory} percent
  static const auto nvml = []() -> std::pair<ByBus, Utilization> {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return {nullptr, nullptr};
    auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<ByBus>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto util = reinterpret_cast<Utilization>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    if (!init || !by_bus || !util || init() != 0) return {nullptr, nullptr};
    return {by_bus, util};
  }();
  if (!nvml.first || pci_bus_id.empty()) return -1;
  void* device = nullptr;
  unsigned int rates[2] = {0, 0};
  if (nvml.first(pci_bus_id.c_str(), &device) != 0 || nvml.second(device, rates) != 0) return -1;
  return rates[0];
}

std::string device_name(const RankReport& r) {
  return r.cuda ? "cuda:" + std::to_string(r.index) : "cpu";
}

std::string mib_text(double mib) {
  char b[32];
  if (mib >= 1024) std::snprintf(b, sizeof b, "%.2f GiB", mib / 1024);
  else std::snprintf(b, sizeof b, "%.0f MiB", mib);
  return b;
}

std::string rate_text(double rate) {
  if (std::isnan(rate)) return "no step in this run";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f samples/s", rate);
  return b;
}

// Rank 0's lines: one per rank, or a summary for large jobs, and a warning for every GPU that
// two ranks share (each rank should drive a GPU of its own).
void print_reports(int64_t epoch, const std::vector<RankReport>& all) {
  const int n = static_cast<int>(all.size());
  if (n <= kRanksListed) {
    for (int r = 0; r < n; ++r) {
      const RankReport& x = all[r];
      std::printf("  epoch %ld, rank %d (%s, %s): %s, peak memory %s%s", epoch + 1, r, x.host,
                  device_name(x).c_str(), rate_text(x.samples_per_s).c_str(),
                  mib_text(x.peak_mem_mib).c_str(), x.cuda ? "" : " (host)");
      if (x.gpu_busy_pct >= 0) std::printf(", GPU busy %.0f%%", x.gpu_busy_pct);
      std::printf("\n");
    }
  } else {
    int slowest = 0, nodes = 0;
    double lo = INFINITY, hi = 0, peak = 0;
    std::map<std::string, int> per_node;
    for (int r = 0; r < n; ++r) {
      const RankReport& x = all[r];
      if (per_node[x.host]++ == 0) ++nodes;
      peak = std::max(peak, x.peak_mem_mib);
      if (std::isnan(x.samples_per_s)) continue;
      if (x.samples_per_s < lo) lo = x.samples_per_s, slowest = r;
      hi = std::max(hi, x.samples_per_s);
    }
    if (std::isinf(lo))  // a run resumed after the epoch's last step: nobody trained
      std::printf("  epoch %ld: %d ranks on %d node%s, no step in this run, peak memory up to %s\n",
                  epoch + 1, n, nodes, nodes == 1 ? "" : "s", mib_text(peak).c_str());
    else
      std::printf("  epoch %ld: %d ranks on %d node%s, %.0f to %.0f samples/s per rank (slowest: "
                  "rank %d, %s, %s), peak memory up to %s\n",
                  epoch + 1, n, nodes, nodes == 1 ? "" : "s", lo, hi, slowest, all[slowest].host,
                  device_name(all[slowest]).c_str(), mib_text(peak).c_str());
  }
  std::map<std::string, int> owner;
  for (int r = 0; r < n; ++r) {
    if (!all[r].cuda) continue;
    const std::string key = std::string(all[r].host) + " " + device_name(all[r]);
    auto [it, fresh] = owner.emplace(key, r);
    if (!fresh)
      std::printf("  kit: warning: ranks %d and %d share %s on %s: each rank should drive a GPU of "
                  "its own (cuda:LOCAL_RANK, from setup())\n",
                  it->second, r, device_name(all[r]).c_str(), all[r].host);
  }
  std::fflush(stdout);
}

// "1 h 02 min", "3 min 05 s", "45 s": precise enough for "shall I wait or get a coffee".
std::string format_duration(double s) {
  char text[48];
  long total = std::lround(std::max(s, 0.0));
  if (total >= 3600)
    std::snprintf(text, sizeof text, "%ld h %02ld min", total / 3600, total % 3600 / 60);
  else if (total >= 60)
    std::snprintf(text, sizeof text, "%ld min %02ld s", total / 60, total % 60);
  else
    std::snprintf(text, sizeof text, "%ld s", total);
  return text;
}

// ", step 40/250 of the epoch, ETA 1 min 23 s", or "" when the epoch's length is not known: the
// steps left times the time per step.
std::string epoch_eta(int64_t done, int64_t of, double per_step) {
  if (of <= 0 || done <= 0 || done > of) return "";
  return ", step " + std::to_string(done) + "/" + std::to_string(of) + " of the epoch, ETA " +
         format_duration(per_step * static_cast<double>(of - done));
}

}  // namespace

Metrics::Metrics(const std::string& out_dir, int64_t batch_size, torch::Device device,
                 int64_t first_step, double progress_every_s, Clock clock)
    : batch_size_(batch_size), steps_(first_step), steps_at_last_line_(first_step),
      ranks_(get_world_size()), batches_(ranks_), device_(device), every_s_(progress_every_s),
      clock_(clock ? std::move(clock) : Clock([] { return std::chrono::steady_clock::now(); })) {
  start_ = last_line_ = last_write_ = epoch_first_ = epoch_last_ = clock_();
  // An instructor watching a demo, or a test that wants every progress line, can ask for more.
  if (const char* every = std::getenv("KIT_PROGRESS_S")) {
    char* end = nullptr;
    double v = std::strtod(every, &end);
    if (end != every && *end == '\0' && v >= 0) every_s_ = v;
  }
  if (device_.is_cuda()) compat::reset_peak_gpu_bytes(device_.index());
  if (get_rank() != 0) return;
  std::string path = out_dir + "/metrics.csv";
  if (first_step > 0) keep_rows_up_to(path, first_step);
  csv_ = std::fopen(path.c_str(), first_step > 0 ? "a" : "w");
  if (csv_ == nullptr) throw std::runtime_error("cannot write " + path);
  if (first_step == 0) std::fputs(kHeader, csv_);
}

Metrics::~Metrics() {
  try {
    write_rows(false);  // a stop's last steps: the program ends cleanly after its checkpoint
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metrics: the last rows of metrics.csv are lost: %s\n", e.what());
  }
  if (csv_) std::fclose(csv_);
}

void Metrics::step(int64_t epoch, const torch::Tensor& loss, int64_t step_in_epoch,
                   int64_t steps_per_epoch) {
  ++steps_;
  auto now = clock_();
  // This rank's epoch: the first step's end starts its clock (so the evaluation before it and
  // the first step's one-time allocations do not count), the last one stops it.
  if (epoch_steps_++ == 0) epoch_first_ = now;
  epoch_last_ = now;
  // Every rank's loss of every step, for the checker's step-by-step comparison with the
  // solution's run (read only when tracing: item() waits for the GPU).
  observe::step(epoch, steps_, loss);
  if (csv_ == nullptr) return;
  // The loss stays on the device until its row is written (see the header).
  rows_.push_back({steps_, epoch, std::chrono::duration<double>(now - start_).count()});
  losses_.push_back(loss.detach());
  // The steps timed: from the end of the epoch's first step (see step_timer() in the header).
  if (epoch_steps_ == 1) {
    timer_.start(now);
    timed_from_ = now, timed_ = 0;
  } else {
    ++timed_;
  }
  step_in_epoch_ = step_in_epoch;
  steps_per_epoch_ = steps_per_epoch;
  // A line every few seconds: long runs show they are alive, short ones stay quiet.
  const bool line = std::chrono::duration<double>(now - last_line_).count() >= every_s_;
  if (line || steps_ % Checkpoints::kStopPollSteps == 0) write_rows(line);
}

void Metrics::data_ranks(int n) {
  if (n < 1 || ranks_ % n != 0)
    throw std::invalid_argument("Metrics::data_ranks: " + std::to_string(n) +
                                " data-parallel ranks must divide the world size " +
                                std::to_string(ranks_));
  batches_ = n;
}

void Metrics::write_rows(bool progress_line) {
  if (csv_ == nullptr || rows_.empty()) return;
  // One read for all of them: the host waits here until the device has done these steps.
  const auto losses = torch::stack(losses_).cpu().to(torch::kDouble).contiguous();
  const double* value = losses.data_ptr<double>();
  const auto now = clock_();  // after the read: device time, on a GPU too
  const int ranks = ranks_;
  const auto n = static_cast<int64_t>(rows_.size());
  // Every row of the batch gets the batch's rate, the host's clock per step being no measure on
  // a GPU, where the host runs ahead (see the header): the samples of the steps timed since the
  // last write (or since the epoch's first step: no evaluation counts) over their time. Only when
  // none was timed (the epoch's first step is the batch), the time since the last write.
  const double per_step =
      timed_ > 0 ? std::chrono::duration<double>(now - timed_from_).count() / static_cast<double>(timed_)
                 : std::chrono::duration<double>(now - last_write_).count() / static_cast<double>(n);
  const double rate = per_step > 0 ? static_cast<double>(batch_size_ * batches_) / per_step : 0.0;
  for (int64_t k = 0; k < n; ++k) {
    const Row& r = rows_[static_cast<size_t>(k)];
    // %.9g: a float32 loss exactly, so two runs can be compared bit for bit from their CSVs.
    std::fprintf(csv_, "%ld,%ld,%.9g,%.1f,%d,%.3f,,,,,\n", r.step, r.epoch + 1, value[k], rate,
                 ranks, r.elapsed_s);
  }
  // The rows reach the file at once: a killed run keeps every row written so far.
  std::fflush(csv_);
  if (progress_line) {
    const Row& last = rows_.back();
    const double since = std::chrono::duration<double>(now - last_line_).count();
    const double avg_rate =
        since > 0
            ? static_cast<double>((steps_ - steps_at_last_line_) * batch_size_ * batches_) / since
            : 0.0;
    std::printf("  epoch %ld, step %ld: loss %.4f, %.0f samples/s, %.0f s elapsed%s\n",
                last.epoch + 1, last.step, value[n - 1], avg_rate,
                std::chrono::duration<double>(now - start_).count(),
                epoch_eta(step_in_epoch_, steps_per_epoch_,
                          epoch_step_seconds(now, per_step)).c_str());
    std::fflush(stdout);
    last_line_ = now;
    steps_at_last_line_ = steps_;
  }
  if (timed_ > 0) {
    timer_.lap(now, timed_);
    timed_from_ = now, timed_ = 0;
  }
  rows_.clear();
  losses_.clear();
  last_write_ = now;
}

double Metrics::epoch_step_seconds(TimePoint last, double otherwise) const {
  const double span = std::chrono::duration<double>(last - epoch_first_).count();
  return epoch_steps_ >= 2 && span > 0 ? span / static_cast<double>(epoch_steps_ - 1) : otherwise;
}

void Metrics::end_epoch(int64_t epoch) {
  // On a GPU the epoch ends when the device has done its last step, not when the host queued it.
  if (device_.is_cuda() && epoch_steps_ > 0) {
    torch::cuda::synchronize(device_.index());
    epoch_last_ = clock_();
  }
  write_rows(false);  // rank 0: the epoch's last step rows, before its rank rows
  // This rank's figures. Its samples/s: the steps after the first, over the time they took; an
  // epoch of one step is timed from the start of the run; NaN when this run did no step of the
  // epoch (resumed after its last step).
  RankReport me{};
  const double one_step = std::max(1e-9, std::chrono::duration<double>(epoch_last_ - start_).count());
  me.samples_per_s = static_cast<double>(batch_size_) /
                     epoch_step_seconds(epoch_last_, epoch_steps_ == 1 ? one_step : NAN);
  me.cuda = device_.is_cuda() ? 1 : 0;
  me.index = device_.is_cuda() ? device_.index() : -1;
  me.gpu_busy_pct = -1;
  if (device_.is_cuda()) {
    me.peak_mem_mib = static_cast<double>(compat::peak_gpu_bytes(me.index)) / (1 << 20);
    me.gpu_busy_pct = gpu_busy_pct(compat::pci_bus_id(me.index));
    compat::reset_peak_gpu_bytes(me.index);  // each epoch its own peak
  } else {
    me.peak_mem_mib = peak_host_mib();
  }
  node_name(me.host, sizeof me.host);
  observe::epoch_report(epoch, epoch_steps_, me.samples_per_s, device_name(me), me.host);
  epoch_steps_ = 0;

  // Everybody's figures to rank 0: one all_gather of the reports as bytes (control traffic:
  // kit::control stages it through the rank's device, which is all NCCL moves).
  const int n = get_world_size();
  std::vector<RankReport> all(n);
  if (n > 1) {
    auto mine = torch::from_blob(&me, {static_cast<int64_t>(sizeof me)}, torch::kUInt8);
    auto gathered = control::all_gather(default_group(), mine);
    std::memcpy(all.data(), gathered.data_ptr(), n * sizeof me);
  } else {
    all[0] = me;
  }
  if (csv_ == nullptr) return;  // rank 0 only from here
  const double elapsed =
      std::chrono::duration<double>(clock_() - start_).count();
  for (int r = 0; r < n; ++r) {
    const RankReport& x = all[r];
    std::fprintf(csv_, "%ld,%ld,,", steps_, epoch + 1);
    if (!std::isnan(x.samples_per_s)) std::fprintf(csv_, "%.1f", x.samples_per_s);
    std::fprintf(csv_, ",%d,%.3f,%d,%s,%s,%.1f,", n, elapsed, r, device_name(x).c_str(), x.host,
                 x.peak_mem_mib);
    if (x.gpu_busy_pct >= 0) std::fprintf(csv_, "%.0f", x.gpu_busy_pct);
    std::fprintf(csv_, "\n");
  }
  std::fflush(csv_);
  print_reports(epoch, all);
}

std::string device_model(torch::Device device) {
  return device.is_cuda() ? compat::gpu_name(device.index()) : device.str();
}

int64_t peak_tensor_bytes(torch::Device device) {
  if (device.is_cuda()) return compat::peak_gpu_bytes(device.index());
  return memory::installed() ? memory::peak_live_bytes() : 0;
}

}  // namespace kit
