// kit/ddp.h — DistributedDataParallel: keeps the model replicas of all ranks identical.
//
//   kit::DistributedDataParallel ddp(model);   // after model->to(device), before the optimizer
//
// What it does, and why:
//  * At construction, rank 0's parameters and buffers are broadcast to every rank, so all
//    replicas start from the same weights (each rank initialised its own randomly).
//  * During every backward, each rank's gradients are averaged over all ranks. After backward
//    every replica holds the same gradient, the optimizer makes the same update everywhere, and
//    the replicas stay identical without ever sending weights again.
//  * Averaging is bucketed and overlapped with backward: a hook on each parameter copies its
//    gradient into a bucket as soon as autograd has produced it; a full bucket starts its
//    all-reduce in the background while backward carries on with earlier layers. At the end of
//    backward we wait for the buckets still in flight and copy the averages back into .grad.
//    Options{.overlap = false} keeps the simple version: one all-reduce per bucket after
//    backward, for teaching and for comparison.
//
// Load weights into a wrapped model by copying values (param.copy_(...), as kit/checkpoint.h
// does), not with Module::load / torch::load: those re-seat the parameters, which replaces the
// autograd nodes the hooks sit on, and gradients would silently stop being averaged.
//
// Python's DDP wraps the module and you call the wrapper. This one only needs to see gradients,
// so it attaches to the model you already have: keep calling model->forward(). The hooks live as
// long as this object.
#pragma once

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "kit/process_group.h"

namespace kit {

struct DDPStats {
  int64_t steps = 0;               // backward passes reduced
  int64_t buckets = 0;             // buckets per step
  double wait_seconds = 0;         // total time spent, after backward, waiting for all-reduces
  double last_wait_seconds = 0;
};

// DistributedDataParallel::Options (declared outside the class so that a default argument can
// use it: `Options options = {}` inside the class is refused by Clang).
struct DDPOptions {
  bool overlap = true;                   // all-reduce during backward (false: after it)
  size_t bucket_cap_bytes = 25u << 20;   // 25 MiB, as PyTorch
  size_t first_bucket_bytes = 1u << 20;  // small, so the first all-reduce starts early
  ProcessGroup* group = nullptr;         // default: the group of kit::setup()
};

class DistributedDataParallel {
 public:
  using Options = DDPOptions;
  struct Reducer;  // the hook machinery, in ddp.cpp

  template <typename M>
  explicit DistributedDataParallel(const torch::nn::ModuleHolder<M>& module, Options options = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), options) {}
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, Options options);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Gradient accumulation without communication: while the returned guard lives, backward
  // passes only add to each rank's own .grad; the first backward after it averages the sum of
  // all of them over the ranks, in one go. Every rank must skip the same steps.
  //   for (int k = 0; k < micro_batches; ++k) {
  //     auto loss = ...;
  //     if (k + 1 < micro_batches) {
  //       auto quiet = ddp.no_sync();  // local only
  //       loss.backward();
  //     } else {
  //       loss.backward();             // the last one: all-reduce the accumulated gradients
  //     }
  //   }
  class NoSync {
   public:
    explicit NoSync(std::shared_ptr<Reducer> r);
    NoSync(NoSync&& other) noexcept : reducer_(std::move(other.reducer_)) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    ~NoSync();
   private:
    std::shared_ptr<Reducer> reducer_;
  };
  [[nodiscard]] NoSync no_sync();

  const DDPStats& stats() const;
  // Parameter indices per bucket, in launch order (see kit/buckets.h).
  const std::vector<std::vector<size_t>>& buckets() const;

 private:
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace kit
