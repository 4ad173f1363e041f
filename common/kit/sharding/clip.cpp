// kit/sharding/clip.cpp — clipping a sharded gradient by its global norm (see clip.h).
#include "kit/sharding/clip.h"

#include <stdexcept>
#include <string>

#include <torch/torch.h>

namespace kit {

double check_max_grad_norm(double max_norm, const char* who) {
  if (!(max_norm >= 0))  // NaN too
    throw std::invalid_argument(std::string(who) + ": max_grad_norm must be > 0 (or 0: no clipping), got " +
                                std::to_string(max_norm));
  return max_norm;
}

torch::Tensor clip_shard_grads_(const std::vector<torch::Tensor>& shard_grads, double max_norm,
                                ProcessGroup& group) {
  if (!(max_norm > 0))
    throw std::invalid_argument("clip_shard_grads_: max_norm must be > 0, got " + std::to_string(max_norm));
  torch::NoGradGuard no_grad;
  // The sum of squares lives where the gradients are (the device, for NCCL), in float32 as
  // clip_grad_norm_ computes its norms; a rank whose shards are all undefined adds zero.
  torch::Device device = group.device();
  for (const auto& g : shard_grads)
    if (g.defined()) device = g.device();
  auto squares = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  for (const auto& g : shard_grads)
    if (g.defined()) squares += g.detach().to(torch::kFloat).pow(2).sum();
  group.all_reduce(squares, ReduceOp::SUM);  // the whole gradient's sum of squares, everywhere
  auto norm = squares.sqrt();
  // clip_grad_norm_'s factor, clamped at 1 (a small gradient is left as it is).
  auto scale = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  for (const auto& g : shard_grads)
    if (g.defined()) g.mul_(scale.to(g.dtype()));
  return norm;
}

}  // namespace kit
