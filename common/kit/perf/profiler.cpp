// kit/perf/profiler.cpp — StepProfiler (see profiler.h).
#include "kit/perf/profiler.h"

#include "kit/compat.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

namespace kit {
namespace {

namespace fs = std::filesystem;
namespace prof = torch::profiler::impl;
using torch::autograd::profiler::KinetoEvent;

// Whether `dir` can hold the trace: made if missing, and a file written there. "" when it can,
// else why not.
std::string unwritable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ec.message();
  const fs::path probe = fs::path(dir) / ".kit-profile-probe";
  std::ofstream f(probe);
  if (!f) return std::strerror(errno);
  f.close();
  fs::remove(probe, ec);
  return "";
}

struct Row {
  std::string name;
  int64_t calls = 0;
  uint64_t self_ns = 0, total_ns = 0;
};

bool is_step_mark(const std::string& name) { return name.rfind("ProfilerStep#", 0) == 0; }

// Self time of every CPU operator: its duration minus that of the events directly inside it on
// the same thread (a stack per thread, events in start order, the longer first at a tie).
std::vector<Row> cpu_table(const std::vector<KinetoEvent>& events, uint64_t* wall_ns) {
  struct Span {
    size_t index;
    uint64_t start, end, children = 0;
  };
  std::map<uint64_t, std::vector<Span>> threads;
  for (size_t i = 0; i < events.size(); ++i) {
    const KinetoEvent& e = events[i];
    if (e.deviceType() != c10::DeviceType::CPU || e.isAsync()) continue;
    threads[e.startThreadId()].push_back({i, compat::event_start_ns(e), compat::event_end_ns(e)});
  }
  std::map<std::string, Row> rows;
  uint64_t first = UINT64_MAX, last = 0;
  for (auto& [tid, spans] : threads) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::vector<Span*> open;
    for (Span& s : spans) {
      while (!open.empty() && open.back()->end <= s.start) open.pop_back();
      if (!open.empty()) open.back()->children += s.end - s.start;
      open.push_back(&s);
    }
    for (const Span& s : spans) {
      const std::string name = events[s.index].name();
      if (is_step_mark(name)) {
        first = std::min(first, s.start), last = std::max(last, s.end);
        continue;
      }
      Row& r = rows[name];
      r.name = name;
      r.calls += 1;
      r.total_ns += s.end - s.start;
      r.self_ns += (s.end - s.start) - std::min(s.children, s.end - s.start);
    }
  }
  *wall_ns = last > first ? last - first : 0;
  std::vector<Row> out;
  for (auto& [name, r] : rows) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.self_ns > b.self_ns; });
  return out;
}

// GPU time by kernel name (each kernel runs once, no nesting).
std::vector<Row> gpu_table(const std::vector<KinetoEvent>& events) {
  std::map<std::string, Row> rows;
  for (const KinetoEvent& e : events) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    Row& r = rows[e.name()];
    r.name = e.name();
    r.calls += 1;
    r.self_ns += compat::event_duration_ns(e);
    r.total_ns += compat::event_duration_ns(e);
  }
  std::vector<Row> out;
  for (auto& [name, r] : rows) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.self_ns > b.self_ns; });
  return out;
}

void print_table(const char* title, const std::vector<Row>& rows, int64_t top, uint64_t whole_ns) {
  uint64_t sum = 0;
  for (const Row& r : rows) sum += r.self_ns;
  const uint64_t base = whole_ns > 0 ? whole_ns : std::max<uint64_t>(sum, 1);
  std::printf("%s\n  %-44s %7s %11s %11s %7s\n", title, "operator", "calls", "self ms", "total ms",
              "self %");
  for (size_t i = 0; i < rows.size() && static_cast<int64_t>(i) < top; ++i) {
    const Row& r = rows[i];
    std::string name = r.name.size() > 44 ? r.name.substr(0, 41) + "..." : r.name;
    std::printf("  %-44s %7ld %11.3f %11.3f %6.1f%%\n", name.c_str(), static_cast<long>(r.calls),
                r.self_ns / 1e6, r.total_ns / 1e6, 100.0 * r.self_ns / base);
  }
}

}  // namespace

StepProfiler::StepProfiler(ProfileOptions options, torch::Device device)
    : options_(std::move(options)), device_(device) {
  if (options_.dir.empty()) return;
  if (options_.start < 1 || options_.steps < 1) {
    std::fprintf(stderr, "kit: --profile-dir %s: the profile needs a first step of 1 or more and "
                 "1 step or more (got %ld and %ld): training goes on without a profile\n",
                 options_.dir.c_str(), static_cast<long>(options_.start),
                 static_cast<long>(options_.steps));
    return;
  }
  if (std::string why = unwritable(options_.dir); !why.empty()) {
    std::fprintf(stderr, "kit: --profile-dir %s cannot be written (%s): training goes on without "
                 "a profile\n", options_.dir.c_str(), why.c_str());
    return;
  }
  path_ = (fs::path(options_.dir) / "trace.json").string();
  if (options_.start == 1) start();  // the first step begins after this
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (const std::exception& e) {  // a destructor must not throw: say it, lose the profile
    std::fprintf(stderr, "kit: the profile could not be finished: %s\n", e.what());
  }
}

void StepProfiler::step() {
  if (path_.empty() || done_) return;
  mark_.reset();  // the step that ended
  ++ended_;
  if (recording_ && ended_ >= options_.start + options_.steps - 1) {
    stop();
  } else if (recording_) {
    mark();
  } else if (ended_ == options_.start - 1) {
    start();
  }
}

void StepProfiler::start() {
  // CPU operators with their input shapes and dtypes; on a GPU its kernels too (CUPTI).
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  recording_ = true;
  mark();
}

void StepProfiler::mark() {
  mark_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (mark_->isActive()) mark_->before("ProfilerStep#" + std::to_string(ended_ + 1));
}

void StepProfiler::finish() {
  mark_.reset();
  if (recording_) stop();
}

void StepProfiler::stop() {
  mark_.reset();
  if (device_.is_cuda()) torch::cuda::synchronize();  // the kernels of the last step, finished
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  recording_ = false;
  done_ = true;
  try {
    result->save(path_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kit: the profile could not be written to %s: %s\n", path_.c_str(),
                 e.what());
    path_.clear();
    return;
  }
  const int64_t last = options_.start + options_.steps - 1;
  std::printf("profile of steps %ld-%ld written to %s (open it at https://ui.perfetto.dev)\n",
              static_cast<long>(options_.start), static_cast<long>(last), path_.c_str());
  uint64_t wall = 0;
  const std::vector<Row> cpu = cpu_table(result->events(), &wall);
  print_table("top operators by self time on the CPU (% of the profiled steps' wall time):", cpu,
              options_.top, wall);
  if (device_.is_cuda())
    print_table("top GPU kernels by time (% of the kernels' total):", gpu_table(result->events()),
                options_.top, 0);
}

}  // namespace kit
