// kit/train/metrics.h — Metrics: metrics.csv, progress lines, and what every rank did in each
// epoch.
//
//   kit::Metrics metrics(args.out_dir, args.batch_size, device);   // once, on every rank
//   metrics.step(epoch, loss);     // after every optimizer step
//   metrics.step(epoch, loss, step_in_epoch, steps_per_epoch);   // the same, with an ETA
//   metrics.end_epoch(epoch);      // after an epoch's last training step (every rank: it gathers)
//
// metrics.csv (written by rank 0) has two kinds of rows, told apart by the `rank` column:
//   step,epoch,loss,samples_per_s,ranks,elapsed_s,rank,device,host,peak_mem_mib,gpu_busy_pct
//   * one row per training step, `rank` empty: rank 0's loss of that step and the throughput of
//     all ranks together; the last five columns are empty;
//   * at each epoch's end, one row per rank, `rank` = its number, `step` = the epoch's last step,
//     `loss` empty: that rank's own samples/s over the epoch, its device and node, and its peak
//     memory (on a GPU: the most the caching allocator held, as torch.cuda.max_memory_allocated();
//     on the CPU: the process's peak resident memory), and on a GPU where NVML is installed, how
//     busy the GPU was over its last sample period (about a second).
// The per-rank rows are the proof that a job really uses every GPU it holds: a rank that sat idle,
// or shares a GPU with another, is one row away. Rank 0 prints the same figures at each epoch's
// end (one line per rank, or a summary beyond 16 ranks).
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include <torch/types.h>

namespace kit {

// What a device is, for a report: "cpu", or the GPU's product name ("NVIDIA H100 80GB HBM3").
std::string device_model(torch::Device device);
// The most bytes of tensors `device` held at once: on a GPU the caching allocator's peak since its
// last reset (torch.cuda.max_memory_allocated(); Metrics resets it at construction and at each
// epoch's end), on the CPU the counting allocator's (kit/train/memory.h: 0 unless installed).
int64_t peak_tensor_bytes(torch::Device device);

class Metrics {
 public:
  // Where the times come from: steady_clock::now unless a test hands in a clock of its own, so
  // that the rates it computes can be checked against numbers worked out by hand.
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // device: the one this rank trains on (setup()'s). first_step > 0: a resumed run; rows are
  // appended after the ones already in the file. progress_every_s: the seconds between two
  // progress lines; KIT_PROGRESS_S in the environment overrides it (0: a line after every step).
  Metrics(const std::string& out_dir, int64_t batch_size, torch::Device device,
          int64_t first_step = 0, double progress_every_s = 10.0, Clock clock = nullptr);
  ~Metrics();
  // step_in_epoch (1-based, counting the steps of this epoch done so far, also before a resume)
  // and steps_per_epoch: when both are given, the progress line says how far into the epoch the
  // run is and when the epoch will end ("step 40/250 of the epoch, ETA 1 min 23 s").
  void step(int64_t epoch, const torch::Tensor& loss, int64_t step_in_epoch = 0,
            int64_t steps_per_epoch = 0);
  // Collective when the process group is up: every rank must call it, at the same point.
  void end_epoch(int64_t epoch);

 private:
  std::FILE* csv_ = nullptr;
  int64_t batch_size_, steps_ = 0, steps_at_last_line_ = 0;
  torch::Device device_;
  double every_s_;
  Clock clock_;
  std::chrono::steady_clock::time_point start_, last_step_, last_line_;
  // This epoch, on this rank: its steps so far and the time of its first and last one.
  int64_t epoch_steps_ = 0;
  std::chrono::steady_clock::time_point epoch_first_, epoch_last_;
  // This epoch's seconds per step, from the end of its first step to the end of its last (the
  // first step's one-time allocations and the evaluation before it do not count); `otherwise`
  // while fewer than two steps were timed.
  double epoch_step_seconds(double otherwise) const;
};

}  // namespace kit
