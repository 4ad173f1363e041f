// kit/ddp/ddp.h — DistributedDataParallel: keeps the model replicas of all ranks identical.
//
//   kit::DistributedDataParallel ddp(model);   // after model->to(device), before the optimizer
//
// What it does, and why:
//  * At construction, rank 0's parameters and buffers are broadcast to every rank, so all
//    replicas start from the same weights (each rank initialised its own randomly).
//  * During every backward, each rank's gradients are averaged over all ranks. After backward
//    every replica holds the same gradient, the optimizer makes the same update everywhere, and
//    the replicas stay identical without ever sending weights again.
//  * Averaging is bucketed and overlapped with backward: each gradient lives in a bucket, a flat
//    buffer shared with other parameters' gradients (param.grad() is a window on it, as with
//    PyTorch's gradient_as_bucket_view). Autograd adds each step's gradient into that window in
//    place, so nothing is copied into or out of the buckets. A hook on each parameter tells us when
//    its gradient is complete; a full bucket starts its all-reduce in the background while
//    backward carries on with earlier layers, and the all-reduce leaves the average right where
//    .grad looks. At the end of backward we wait for the buckets still in flight.
//  * Buckets are first filled in reverse parameter order (a guess: backward starts at the last
//    layer). The first backward records the order the gradients really arrive in; after it, the
//    buckets are rebuilt in rank 0's order (kit/ddp/buckets.h), so that each one fills up as early
// as
//    possible. Options{.overlap = false} keeps the simple version: one all-reduce per bucket
//    after backward, no rebuild (the order only matters when buckets leave during backward), for
//    teaching and for comparison.
//  * optimizer.zero_grad() (set_to_none) drops the window: the next backward's gradient then
//    arrives in a tensor of autograd's own, is copied into the bucket once, and .grad becomes the
//    window again. zero_grad(false) zeroes the window in place and skips that copy.
//
// Load weights into a wrapped model by copying values (param.copy_(...), as kit/train/checkpoint.h
// does), not with Module::load / torch::load: those re-seat the parameters, which replaces the
// autograd nodes the hooks sit on, and gradients would silently stop being averaged.
//
// The training forward goes through the wrapper, as in Python (ddp_model(x)): ddp.forward(x).
// Two things happen there, as in PyTorch's DistributedDataParallel.forward:
//  * it prepares the next backward: a forward with gradients on arms the reducer, and that
//    backward's gradients are averaged (PyTorch's prepare_for_backward). A backward whose forward
//    went around the wrapper (model->forward(x)) would not be averaged by PyTorch, silently; the
//    kit stops it instead, with one line at its first gradient. Evaluation may call
//    model->forward under NoGradGuard: nothing is prepared, and nothing needs to be.
//  * buffers (batch norm's running statistics): as PyTorch's default broadcast_buffers=True,
//    ddp.forward(x) first copies rank 0's buffers to every rank, then calls model->forward(x).
//    So in training every rank's batch norm starts each step from rank 0's statistics and adds
//    its own batch to them; model->forward(x) skips the copy, as ddp.module(x) does in Python.
//    Like PyTorch, a forward broadcasts only when the previous one through the wrapper ran with
//    gradients and outside no_sync() (the first one always does): once per averaged step, and
//    an evaluation under NoGradGuard broadcasts once, at its first forward.
// ddp.forward needs the module's forward(Tensor) -> Tensor; a forward of another signature goes
// through ddp.forward_with([&] { return model->forward(a, b); }), which does the same around it.
//
// Every trainable parameter must get a gradient in every averaged backward, or backward ends
// with one error naming it, as PyTorch's Reducer raises; a branch taken only for some inputs
// needs Options{.find_unused_parameters = true}. Then a parameter unused on this rank adds zeros
// (or what no_sync() micro-steps accumulated) to the average, and one that no rank used in any
// micro-step of the step keeps its .grad as it was (undefined after zero_grad()), so that weight
// decay and momentum do not move it as if its gradient were 0 (PyTorch does the same, counting
// the no_sync() micro-steps in its local_used_map). A hook that fires without a gradient (an
// output that does not reach the loss) is not a use. Unlike PyTorch, which finds them by walking the graph from the output
// at the forward, the kit finds them when backward ends: their buckets leave last. A gradient
// hook that fires twice for one parameter in one backward (reentrant activation checkpointing,
// two backwards through one graph) is an error naming the parameter, as in PyTorch: its bucket
// may already be on the wire. The hooks live as long as this object.
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "kit/runtime/process_group.h"

namespace kit {

struct DDPStats {
  int64_t steps = 0;               // backward passes reduced
  int64_t buckets = 0;             // buckets per step (after the rebuild: the rebuilt ones)
  int64_t all_reduces = 0;         // bucket all-reduces started, all steps together
  bool rebuilt = false;            // buckets re-made in the order the gradients arrived
  double wait_seconds = 0;         // total time spent, after backward, waiting for all-reduces
  // The last step's parts (the benchmark prints them). The wait and reduce times are the host's
  // clock on the CPU and the GPU's own time (CUDA events on the current stream) on a GPU, where
  // NCCL works on a stream of its own and a host clock would time only the enqueue. On a GPU a
  // step is timed at the end of the next backward if the device has finished it by then (the host
  // does not wait for it there: wait_seconds leaves out the steps it was ahead of), else by
  // stats(), which waits:
  double last_wait_seconds = 0;    // after backward, waiting for the all-reduces in flight
  double last_copy_seconds = 0;    // copying gradients into buckets (0 when they were in place)
  double last_reduce_seconds = 0;  // first all-reduce started -> the last one seen finished
  int64_t last_reduce_bytes = 0;   // bytes all-reduced
};

// DistributedDataParallel::Options (declared outside the class so that a default argument can
// use it: `Options options = {}` inside the class is refused by Clang).
struct DDPOptions {
  bool overlap = true;                   // all-reduce during backward (false: after it)
  size_t bucket_cap_bytes = 25u << 20;   // 25 MiB, as PyTorch
  size_t first_bucket_bytes = 1u << 20;  // small, so the first all-reduce starts early
  // The ranks that replicate the model: default the world (kit::setup()'s group), or a group from
  // kit::new_group() that this rank is a member of (each group then trains replicas of its own;
  // "rank 0" in this header is the group's rank 0). Another world's group: an error.
  ProcessGroup* group = nullptr;
  bool broadcast_buffers = true;         // ddp.forward() copies rank 0's buffers first (PyTorch's)
  bool find_unused_parameters = false;   // a parameter without gradient is allowed (see above)
};

class DistributedDataParallel {
 public:
  using Options = DDPOptions;
  struct Reducer;  // the hook machinery, in ddp.cpp

  // `site`: where the trainer made the wrapper (filled in by the compiler), named by its errors.
  template <typename M>
  explicit DistributedDataParallel(const torch::nn::ModuleHolder<M>& module, Options options = {},
                                   CallSite site = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), options,
                                site) {
    if constexpr (requires(M& m, const torch::Tensor& x) { { m.forward(x) } -> std::convertible_to<torch::Tensor>; })
      set_forward([m = module.ptr()](const torch::Tensor& x) -> torch::Tensor { return m->forward(x); });
  }
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, Options options,
                          CallSite site = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Gradient accumulation without communication: a forward run while the returned guard lives
  // prepares a local backward, which only adds to each rank's own .grad; the first backward of a
  // forward outside the guard averages the sum of all of them over the ranks, in one go. Every
  // rank must skip the same steps. As in PyTorch, the guard is read by the FORWARD: put the
  // forward and the backward inside it. (A forward outside the guard followed by a backward
  // inside it is averaged, as PyTorch does: its forward prepared it.)
  //   for (int k = 0; k < micro_batches; ++k) {
  //     if (k + 1 < micro_batches) {
  //       auto quiet = ddp.no_sync();  // local only: forward and backward inside the guard
  //       (loss_fn(ddp.forward(x[k]), y[k]) / micro_batches).backward();
  //     } else {                       // the last one: all-reduce the accumulated gradients
  //       (loss_fn(ddp.forward(x[k]), y[k]) / micro_batches).backward();
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

  // PyTorch's ddp(x): rank 0's buffers to every rank (Options::broadcast_buffers; see above),
  // then the module's forward(x), which prepares the next backward (see above).
  torch::Tensor forward(const torch::Tensor& input);
  // The same around any forward: ddp.forward_with([&] { return model->forward(a, b); }).
  template <typename F>
  auto forward_with(F&& body) {
    before_forward();
    auto output = body();
    after_forward();
    return output;
  }

  const DDPStats& stats() const;
  // Parameter indices per bucket, in launch order (see kit/ddp/buckets.h); after the first backward
  // with overlap, the rebuilt buckets.
  const std::vector<std::vector<size_t>>& buckets() const;

 private:
  void set_forward(std::function<torch::Tensor(const torch::Tensor&)> call);
  void before_forward();  // the buffers' broadcast
  void after_forward();   // the next backward prepared: averaged, or local inside no_sync()
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace kit
