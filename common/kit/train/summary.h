// kit/train/summary.h — StepTimer and append_summary(): one CSV row of figures per run, for the
// scaling study (many runs, one file). Plain C++, no LibTorch.
//
//   label,world_size,nodes,batch_per_rank,global_batch,accum_steps,workers,steps,step_time_s,
//   images_per_s,images_per_s_per_rank,test_loss,test_acc,time_to_target_s,device
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kit {

// The time of a training step. Call lap() at points where the device has finished every step so
// far, saying how many steps ended since the previous lap: each of them took an equal part of the
// time between the two. A host clock alone cannot time one step on a GPU, where the host runs
// ahead of the device (kit::Metrics laps one where it reads the losses: its step_timer()).
class StepTimer {
 public:
  void lap(int64_t steps = 1) { lap(std::chrono::steady_clock::now(), steps); }
  // The same at a given time: the tests drive the timer with a clock of their own. The first lap
  // only starts the clock, and so does start(): a pause that is not a step (an evaluation)
  // does not count.
  void lap(std::chrono::steady_clock::time_point now, int64_t steps = 1);
  void start(std::chrono::steady_clock::time_point now);
  // The median step, leaving out the first `skip` steps timed (allocations, DDP's bucket
  // rebuild, caches); all of them when there are no more; 0 before two laps.
  double median_seconds(size_t skip = 3) const;
  int64_t steps() const { return static_cast<int64_t>(seconds_.size()); }

 private:
  std::vector<double> seconds_;
  std::chrono::steady_clock::time_point last_{};
  bool started_ = false;
};

struct RunSummary {
  std::string label;
  int world_size = 1, nodes = 1;
  int64_t batch_per_rank = 0, global_batch = 0, accum_steps = 1, workers = 0, steps = 0;
  double step_time_s = 0;
  double test_loss = 0, test_acc = 0;
  double time_to_target_s = -1;  // < 0: the target accuracy was never reached (empty cell)
  std::string device;            // "cpu", "NVIDIA H100 80GB HBM3", ...
};

// The nodes of the job: world size / ranks per node, from the launcher's environment
// (kit/runtime/env.h).
int node_count();

// Appends one row to `path` (the header first when the file is new or empty). images_per_s is
// global_batch / step_time_s. Throws std::runtime_error when the file cannot be written.
void append_summary(const std::string& path, const RunSummary& row);

}  // namespace kit
