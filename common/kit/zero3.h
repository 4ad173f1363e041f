// kit/zero3.h — FullyShardedModel: ZeRO stage 3, FSDP-style. Even the parameters are sharded.
//
//   kit::FullyShardedModel sharded(model, {.stage = 3, .adamw = AdamWOptions(1e-3)});
//   auto loss = kit::lm_loss(sharded.forward(input), target);  // not model->forward
//   loss.backward(); sharded.step(); sharded.zero_grad();
//
// The model is a chain of units (TransformerLM::units(): the embedding, each Transformer block,
// the output layer). Each unit's parameters get a flat layout of their own (kit/sharding.h), and
// rank r keeps only its shard of each: of the weights, of the gradients, of AdamW's moments,
// 16 P / N bytes in all. The model's own parameter tensors are left empty between uses.
//
// A unit's forward: all-gather its full weights from the ranks' shards, run it, free them. Its
// backward: all-gather them again, run its forward once more with autograd on, back-propagate
// through it, reduce-scatter its weight gradients (each rank receives the average of its shard),
// free the weights. So the full weights of one unit at a time exist, never the whole model.
//
// How, with no module pre-hooks in LibTorch's C++ API: each unit runs inside a custom autograd
// Function (GatheredUnit, in zero3.cpp) whose inputs are the unit's input and the unit's weight
// shard (a leaf tensor that requires grad: the parameter AdamW updates). Its forward runs under
// no-grad and saves only its input; its backward is the second gather, the recomputation and
// the reduce-scatter, and returns the shard's gradient, which autograd adds into shard.grad().
//
// The price: one extra forward per unit in backward (as activation checkpointing pays), because
// keeping what autograd would save for the unit's backward would keep the full weights alive,
// the very thing sharding frees. Dropout draws the same masks in the recomputation: the random
// generator's state is saved at the forward and restored for it. Communication: all-gather in
// forward, all-gather and reduce-scatter in backward, 3 (N-1)/N x 4P bytes sent per rank in a
// ring, against DDP's 2 (N-1)/N x 4P: 1.5x.
#pragma once

#include <memory>
#include <vector>

#include <torch/types.h>

#include "kit/param_claim.h"     // ParameterClaim: not together with DDP
#include "kit/process_group.h"   // ProcessGroup: all_gather, reduce_scatter, broadcast
#include "kit/sharding.h"        // ShardLayout, ShardedAdamW, HeldBytes
#include "kit/transformer_lm.h"  // TransformerLM and its units()
#include "kit/zero.h"  // ZeroOptions

namespace kit {

class FullyShardedModel {
 public:
  struct Unit;  // one unit's layout, shard, gradient and AdamW state (zero3.cpp)

  FullyShardedModel(TransformerLM& model, ZeroOptions options);
  FullyShardedModel(std::vector<TransformerLMImpl::Unit> units, ZeroOptions options);
  ~FullyShardedModel();
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  torch::Tensor forward(const torch::Tensor& input);  // the chain of units, each gathered in turn
  void zero_grad();
  // AdamW on each unit's shard: no communication (backward did it), except, with
  // ZeroOptions::max_grad_norm, one all-reduce of a number for the global norm (kit/clip.h).
  void step();
  const torch::Tensor& grad_norm() const { return grad_norm_; }  // as ZeroOptimizer::grad_norm()

  HeldBytes held() const;
  int64_t numel() const;   // P: all units' parameters
  int64_t padded() const;  // all units' padded layouts together
  ProcessGroup& group() const { return *group_; }
  // This rank's shards (one per unit) and their AdamW states, for sharded checkpoints.
  std::vector<torch::Tensor> shards() const;
  std::vector<ShardedAdamW*> adamw();

  // For GatheredUnit: the unit's full weights into its parameters, and back to nothing.
  void gather(Unit& unit);
  void release(Unit& unit);
  ProcessGroup* group_ptr() const { return group_; }

 private:
  std::shared_ptr<ProcessGroup> keep_group_;
  ProcessGroup* group_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::unique_ptr<ParameterClaim> claim_;
  int64_t gathered_now_ = 0, gathered_peak_ = 0;  // bytes of full weights alive
  double max_grad_norm_ = 0;  // 0: no clipping
  torch::Tensor grad_norm_;
};

}  // namespace kit
