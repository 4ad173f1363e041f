// kit/perf/profiler.h — StepProfiler: the Kineto profiler (torch.profiler's engine) over a few
// training steps: a trace to look at, and the operators that took the time.
//
//   kit::StepProfiler profiler({.dir = "profile", .start = 3, .steps = 3}, device);
//   for (...) {
//     ... forward, backward, optimizer step ...
//     profiler.step();       // at the end of every training step, as torch.profiler's prof.step()
//   }
//
// Steps start .. start + steps - 1 (counted from 1) are recorded; the first ones are left out:
// they allocate and warm caches (torch.profiler.schedule's wait and warmup). Each is marked
// "ProfilerStep#N", as torch.profiler does. Right after the last of them the profiler stops and
// writes DIR/trace.json, a Chrome trace
// (open it at https://ui.perfetto.dev or chrome://tracing: one row per thread, every operator a
// bar with its input shapes and dtypes), and prints the operators that took the most time of
// their own (self time: without the operators they called), as torch.profiler's
// key_averages().table(sort_by="self_cpu_time_total"); on a GPU also the kernels that took the
// most GPU time.
//
// A DIR that cannot be written is one line on stderr when the profiler is made, and training goes
// on without a profile: a profile is worth less than the run it would stop. An empty DIR: off.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>

namespace at {
class RecordFunction;
}

namespace kit {

struct ProfileOptions {
  std::string dir;     // where trace.json goes ("": no profile)
  int64_t start = 3;   // the first step recorded (steps count from 1)
  int64_t steps = 3;   // how many
  int64_t top = 12;    // rows of the printed table
};

class StepProfiler {
 public:
  StepProfiler(ProfileOptions options, torch::Device device);
  ~StepProfiler();  // finish()
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // A training step has ended: the next one is marked, the window starts before step
  // options.start and ends after its last step (the trace written, the table printed).
  void step();
  // Stops a profile still running (a run with fewer steps than the window: what there is).
  void finish();
  bool recording() const { return recording_; }
  // DIR/trace.json, or "" when there is no profile (off, or DIR cannot be written).
  const std::string& trace_path() const { return path_; }

 private:
  void start();
  void mark();
  void stop();

  ProfileOptions options_;
  torch::Device device_;
  std::string path_;
  int64_t ended_ = 0;  // training steps ended so far
  bool recording_ = false, done_ = false;
  std::unique_ptr<at::RecordFunction> mark_;  // the current step's "ProfilerStep#N"
};

}  // namespace kit
