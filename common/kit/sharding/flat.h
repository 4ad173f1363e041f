// kit/sharding/flat.h — FlatParameters: a model's weights and gradients as two flat buffers in
// ShardLayout order, for writing ZeRO-1's step by hand (exercise 03, TODO 2).
//
//   kit::FlatParameters flat(model);     // rank 0's weights everywhere, as DDP starts
//   kit::ShardedAdamW adamw(options, flat.layout().own(flat.params()));  // state: S elements
//   ... loss.backward();                 // every .grad lands in flat.grads()
//   kit::reduce_scatter(shard, flat.grads(), kit::ReduceOp::AVG);   // ... and so on
//
// Every trainable parameter becomes a view of its part of one flat weight buffer of N S elements
// (kit/sharding/sharding.h, ShardLayout: the parameters end to end in the model's order, padded
// with zeros to N equal shards; rank r owns shard r), and every .grad a view of its part of one
// flat gradient buffer of the same layout. So the flat buffers ARE the model's weights and
// gradients: a collective on flat.grads() reads what backward made, an update of the own shard of
// flat.params() changes the model, an all-gather into flat.params() gives every rank the whole
// model. Nothing is copied on the way (kit::ZeroOptimizer does the same with buckets: zero.h).
//
// The gradient buffer is made (zeros) just before backward adds the first gradient (a hook on
// each parameter; autograd then adds into the views in place: 0 + g is g, bit for bit) and lives
// until drop_grads(), which frees it and every .grad (torch's zero_grad(set_to_none)). A
// parameter that gets no gradient in a backward keeps zeros in its part.
//
// At construction rank 0's trainable weights are broadcast (one flat broadcast), and so are its
// frozen parameters and buffers, as DDP and ZeroOptimizer do. DDP or another ZeRO wrapper on the
// same parameters is one error line (kit/ddp/param_claim.h). Errors end with the caller's line
// (CallSite), so that kit check places them in their TODO.
#pragma once

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "kit/ddp/param_claim.h"        // ParameterClaim: not together with DDP
#include "kit/runtime/process_group.h"  // ProcessGroup, CallSite
#include "kit/sharding/sharding.h"      // ShardLayout, ShardedAdamW, HeldBytes

namespace kit {

class FlatParameters {
 public:
  // The model's trainable parameters on `group` (default: the world of setup()).
  template <typename M>
  FlatParameters(const torch::nn::ModuleHolder<M>& model, ProcessGroup* group = nullptr,
                 CallSite site = {})
      : FlatParameters(*model, group, site) {}
  FlatParameters(const torch::nn::Module& model, ProcessGroup* group = nullptr, CallSite site = {});
  ~FlatParameters();  // takes its hooks off the parameters
  FlatParameters(const FlatParameters&) = delete;  // the hooks point at this object
  FlatParameters& operator=(const FlatParameters&) = delete;

  const ShardLayout& layout() const { return layout_; }
  ProcessGroup& group() const { return *group_; }
  // The weights, N S elements: every trainable parameter is a view of its part.
  torch::Tensor& params() { return params_flat_; }
  // The gradients, N S elements, every .grad a view of its part: made by backward, freed by
  // drop_grads(). Asked for while there is none (before the first backward, after
  // drop_grads()): std::logic_error, one line ending with the caller's line.
  torch::Tensor& grads(CallSite site = {});
  bool has_grads() const { return grads_flat_.defined(); }
  // Frees the flat gradient and every .grad (zero_grad(set_to_none)).
  void drop_grads();

  // What this rank holds: the weights (4P bytes), the .grads while they exist plus `kept_grads`
  // (a shard of the gradient kept past step(), ZeRO-2's), and `adamw`'s two moments.
  HeldBytes held(const ShardedAdamW& adamw, const torch::Tensor& kept_grads = {}) const;

 private:
  void make_grads();  // the hook: the flat gradient, zeros, handed out as every .grad

  std::shared_ptr<ProcessGroup> keep_group_;
  ProcessGroup* group_;
  std::vector<torch::Tensor> params_;  // the trainable ones, in the model's order
  ParameterClaim claim_;
  ShardLayout layout_;
  torch::Tensor params_flat_, grads_flat_;
  std::vector<unsigned> hooks_;
};

}  // namespace kit
