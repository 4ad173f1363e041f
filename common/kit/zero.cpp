// kit/zero.cpp — ZeRO stages 1 and 2 (see zero.h).
#include "kit/zero.h"

#include <stdexcept>

#include <torch/torch.h>

#include "kit/clip.h"         // clip_shard_grads_: --clip-grad on a sharded gradient
#include "kit/distributed.h"  // default_group_ptr

namespace kit {
namespace {

std::vector<torch::Tensor> trainable(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params)
    if (p.requires_grad()) out.push_back(p);
  if (out.empty()) throw std::invalid_argument("ZeroOptimizer: the model has no trainable parameters");
  return out;
}

int stage_1_or_2(int stage) {
  check_zero_stage(stage);
  if (stage != 1 && stage != 2)
    throw std::invalid_argument("ZeroOptimizer does stages 1 and 2, not " + std::to_string(stage) +
                                " (stage 0 is DistributedDataParallel, 3 is FullyShardedLM)");
  return stage;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<torch::Tensor> params, ZeroOptions options)
    : keep_group_(options.group ? nullptr : default_group_ptr()),
      group_(options.group ? options.group : keep_group_.get()),
      stage_(stage_1_or_2(options.stage)),
      params_(trainable(params)),
      claim_(params_, "ZeRO-" + std::to_string(stage_)),
      layout_(params_, group_->size(), group_->rank()),
      adamw_(options.adamw, torch::zeros({layout_.shard()}, params_[0].options().requires_grad(false))),
      max_grad_norm_(check_max_grad_norm(options.max_grad_norm, "ZeroOptimizer")) {
  // Rank 0's weights everywhere, as DDP does: in one flat broadcast.
  torch::NoGradGuard no_grad;
  auto flat = layout_.flatten(params_);
  group_->broadcast(flat, 0);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(layout_.part(flat, i));
}

void ZeroOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  grad_shard_ = torch::Tensor();
}

void ZeroOptimizer::step() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : params_) grads.push_back(p.grad());
  // 1. Average the gradients, but only our shard of them comes back: a reduce-scatter. The flat
  //    copy lives only during this step.
  auto flat_grad = layout_.flatten(grads);
  torch::Tensor my_grad = torch::empty({layout_.shard()}, flat_grad.options());
  group_->reduce_scatter(my_grad, flat_grad, ReduceOp::AVG);
  if (max_grad_norm_ > 0) grad_norm_ = clip_shard_grads_({my_grad}, max_grad_norm_, *group_);
  if (stage_ == 2) {
    grad_shard_ = my_grad;  // the only gradient kept
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }
  // Stage 1 keeps every parameter's .grad as backward left it (this rank's own gradient, not
  // the average): gradient memory is not sharded at stage 1.
  // 2. AdamW on our shard only, with our shard of the state.
  auto own = layout_.own(layout_.flatten(params_));
  adamw_.update(own, my_grad);
  // 3. Everybody's updated shard, to everybody.
  gather_params(own);
}

void ZeroOptimizer::gather_params(const torch::Tensor& own) {
  torch::NoGradGuard no_grad;
  auto flat = torch::empty({layout_.padded()}, own.options());
  group_->all_gather(flat, own.contiguous());
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(layout_.part(flat, i));
}

torch::Tensor ZeroOptimizer::own_params() const {
  return layout_.own(layout_.flatten(params_)).clone();
}

void ZeroOptimizer::load_own_params(const torch::Tensor& shard) {
  if (shard.numel() != layout_.shard())
    throw std::invalid_argument("ZeroOptimizer: a shard of " + std::to_string(shard.numel()) +
                                " elements for shards of " + std::to_string(layout_.shard()));
  gather_params(shard.to(params_[0].options().requires_grad(false)));
}

HeldBytes ZeroOptimizer::held() const {
  HeldBytes b;
  b.params = bytes_of(params_);
  std::vector<torch::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.grad());
  grads.push_back(grad_shard_);
  b.grads = bytes_of(grads);
  b.optimizer = adamw_.bytes();
  return b;
}

}  // namespace kit
