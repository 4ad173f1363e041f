// kit/train/metrics.h — Metrics: metrics.csv, progress lines, and what every rank did in each
// epoch.
//
//   kit::Metrics metrics(args.out_dir, args.batch_size, device);   // once, on every rank
//   metrics.step(epoch, loss);     // after every optimizer step
//   metrics.step(epoch, loss, step_in_epoch, steps_per_epoch);   // the same, with an ETA
//   metrics.end_epoch(epoch);      // after an epoch's last training step (every rank: it gathers)
//   metrics.data_ranks(dp);        // once, where the ranks of one model read the same batches
//
// metrics.csv (written by rank 0) has two kinds of rows, told apart by the `rank` column:
//   step,epoch,loss,samples_per_s,ranks,elapsed_s,rank,device,host,peak_mem_mib,gpu_busy_pct
//   * one row per training step, `rank` empty: rank 0's loss of that step, the throughput of all
//     ranks together (a batch that several ranks train on together counted once:
//     data_ranks()), and the host's clock when the step was done (elapsed_s); the last five
//     columns are empty;
//   * at each epoch's end, one row per rank, `rank` = its number, `step` = the epoch's last step,
//     `loss` empty: that rank's own samples/s over the epoch, its device and node, and its peak
//     memory (on a GPU: the most the caching allocator held, as torch.cuda.max_memory_allocated();
//     on the CPU: the process's peak resident memory), and on a GPU where NVML is installed, how
//     busy the GPU was over its last sample period (about a second).
// The per-rank rows are the proof that a job really uses every GPU it holds: a rank that sat idle,
// or shares a GPU with another, is one row away. Rank 0 prints the same figures at each epoch's
// end (one line per rank, or a summary beyond 16 ranks).
//
// step() reads nothing from the device. Reading a step's loss (.item()) makes the host wait until
// the GPU has finished that step, and the GPU then idles while the host queues the next one. So
// rank 0 keeps the losses on the device, and writes the rows in batches, reading all their losses
// at once: when a progress line is due, at every kit::Checkpoints::kStopPollSteps-th global step
// (10), at end_epoch() and in the destructor. The file is the same, one row per step, in order.
// On a GPU the host runs ahead of the device, so the host's clock at a step says when the step was
// queued, not when it was done: the samples_per_s of a row is that of the rows written with it,
// their samples over the time from the previous batch's read to this one's (each read waits for
// the device, so both ends are device time; after an evaluation, from the end of the epoch's
// first step, so that the evaluation does not count). elapsed_s stays the host's clock at the
// step.
// A killed run (SIGKILL, a node failure) loses the rows not yet written: at most the 9 steps since
// the last multiple of 10. Its last checkpoint's rows are always written: an epoch's checkpoint
// follows end_epoch(), a signal's stop comes at a polling step (a multiple of 10), whose rows
// step() wrote first (call step() before Checkpoints::stop_requested), and a test hook's stop ends
// the program cleanly. A resumed run keeps the rows up to its checkpoint's step and writes the
// rest again, so every step appears once.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "kit/train/summary.h"  // StepTimer

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
  // Collective when the process group is up: every rank must call it, at the same point. On a
  // GPU it waits for the device first (once per epoch), so that the epoch's time is the device's.
  void end_epoch(int64_t epoch);
  // The ranks that train on batches of their own: the mesh's dp size where the ranks of one copy
  // of the model read the same batches (tensor or pipeline parallelism). The step rows' and the
  // progress lines' samples/s then count each batch once, batch_size x n. The default is the
  // world size: every rank trains on a batch of its own. n must divide the world size (else
  // std::invalid_argument). A rank's own row at an epoch's end stays the batches that rank went
  // through, per second.
  void data_ranks(int n);
  // Rank 0's time of a step (the scaling study's, exercise 02): lapped wherever a batch of rows is
  // written, after the read of their losses (device time); each epoch's first step starts the
  // clock afresh, so that neither an evaluation nor the first step's allocations count. On a GPU
  // the start is the host's clock after queueing the epoch's first step, which the device, idle
  // after the evaluation, is at most that one step behind. Empty on the other ranks.
  const StepTimer& step_timer() const { return timer_; }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  // Rank 0: writes the rows not written yet (one read of their losses), and the progress line.
  void write_rows(bool progress_line);

  std::FILE* csv_ = nullptr;
  int64_t batch_size_, steps_ = 0, steps_at_last_line_ = 0;
  int ranks_;  // the world size when made (the destructor may run after destroy_process_group())
  int batches_;  // the batches of a step, all ranks together: data_ranks(), else ranks_
  torch::Device device_;
  double every_s_;
  Clock clock_;
  TimePoint start_, last_line_, last_write_;
  // Rank 0's rows not written yet: each step's number, epoch and host time, and its loss, still
  // on the device; and the epoch position the progress line shows.
  struct Row {
    int64_t step, epoch;
    double elapsed_s;
  };
  std::vector<Row> rows_;
  std::vector<torch::Tensor> losses_;
  int64_t step_in_epoch_ = 0, steps_per_epoch_ = 0;
  StepTimer timer_;
  // The steps since timed_from_ (the end of the epoch's first step, or the last write after it).
  int64_t timed_ = 0;
  TimePoint timed_from_;
  // This epoch, on this rank: its steps so far and the time of its first and last one.
  int64_t epoch_steps_ = 0;
  TimePoint epoch_first_, epoch_last_;
  // This epoch's seconds per step, from the end of its first step to `last` (the first step's
  // one-time allocations and the evaluation before it do not count); `otherwise` while fewer
  // than two steps were timed.
  double epoch_step_seconds(TimePoint last, double otherwise) const;
};

}  // namespace kit
