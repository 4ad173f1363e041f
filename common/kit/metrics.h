// kit/metrics.h — Metrics: a metrics.csv for plots and a progress line now and then, on rank 0.
//
//   kit::Metrics metrics(args.out_dir, args.batch_size);   // once
//   metrics.step(epoch, loss);                              // after every optimizer step
//
// metrics.csv has one row per training step: step,epoch,loss,samples_per_s,ranks,elapsed_s
// (loss: rank 0's loss of that step; samples_per_s: all ranks together). Only rank 0 writes,
// so a trainer can call it on every rank.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include <torch/types.h>

namespace kit {

class Metrics {
 public:
  // first_step > 0: a resumed run; rows are appended after the ones already in the file.
  Metrics(const std::string& out_dir, int64_t batch_size, int64_t first_step = 0,
          double progress_every_s = 10.0);
  ~Metrics();
  void step(int64_t epoch, const torch::Tensor& loss);

 private:
  std::FILE* csv_ = nullptr;
  int64_t batch_size_, steps_ = 0, steps_at_last_line_ = 0;
  double every_s_;
  std::chrono::steady_clock::time_point start_, last_step_, last_line_;
};

}  // namespace kit
