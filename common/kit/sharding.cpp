// kit/sharding.cpp — the flat layout, AdamW on a shard, the byte counts (see sharding.h).
#include "kit/sharding.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

namespace kit {

int check_zero_stage(int stage) {
  if (stage < 0 || stage > 3)
    throw std::invalid_argument("ZeRO stage " + std::to_string(stage) +
                                " does not exist: use 0 (DDP), 1, 2 or 3");
  return stage;
}

ShardLayout::ShardLayout(const std::vector<torch::Tensor>& params, int world, int rank)
    : world_(world), rank_(rank) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("ShardLayout: rank " + std::to_string(rank) + " of " +
                                std::to_string(world) + " ranks");
  for (const auto& p : params) {
    shapes_.push_back(p.sizes().vec());
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  shard_ = (numel_ + world - 1) / world;  // rounded up: the last shard ends in padding
}

torch::Tensor ShardLayout::flatten(const std::vector<torch::Tensor>& tensors) const {
  if (tensors.size() != shapes_.size())
    throw std::invalid_argument("ShardLayout::flatten: " + std::to_string(tensors.size()) +
                                " tensors for a layout of " + std::to_string(shapes_.size()));
  torch::Tensor like;
  for (const auto& t : tensors)
    if (t.defined()) { like = t; break; }
  auto flat = torch::zeros({padded()}, like.defined() ? like.options() : torch::TensorOptions());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].defined()) part(flat, i).copy_(tensors[i]);
  return flat;
}

torch::Tensor ShardLayout::part(const torch::Tensor& flat, size_t i) const {
  int64_t n = 1;
  for (int64_t d : shapes_[i]) n *= d;
  return flat.narrow(0, offsets_[i], n).view(shapes_[i]);
}

ShardedAdamW::ShardedAdamW(const torch::optim::AdamWOptions& options, const torch::Tensor& like)
    : options_(options),
      exp_avg_(torch::zeros_like(like)),
      exp_avg_sq_(torch::zeros_like(like)) {}

// torch::optim::AdamW::step for one tensor (without amsgrad), operation for operation, so that the
// sharded run matches the unsharded one to the last bit where the gradients agree. Every operation
// is element by element, so it runs over the shard in chunks: the same values, but the temporary
// (`denom`) is one chunk (at most 1 MiB of fp32 and an eighth of the shard), not a second and
// third copy of the whole shard, which would undo at the peak much of what sharding saved.
void ShardedAdamW::update(torch::Tensor param, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  const int64_t kChunk = std::max<int64_t>(1, std::min<int64_t>(int64_t{1} << 18, (param.numel() + 7) / 8));
  const double lr = options_.lr();
  const auto [beta1, beta2] = options_.betas();
  ++step_;
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step_));
  const int64_t n = param.numel();
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t len = std::min(kChunk, n - at);
    auto p = param.narrow(0, at, len), g = grad.narrow(0, at, len);
    auto m = exp_avg_.narrow(0, at, len), v = exp_avg_sq_.narrow(0, at, len);
    p.mul_(1 - lr * options_.weight_decay());
    m.mul_(beta1).add_(g, 1 - beta1);
    v.mul_(beta2).addcmul_(g, g, 1 - beta2);
    auto denom = v.sqrt().div_(std::sqrt(bias_correction2)).add_(options_.eps());
    p.addcdiv_(m, denom, -lr / bias_correction1);
  }
}

int64_t ShardedAdamW::bytes() const { return bytes_of({exp_avg_, exp_avg_sq_}); }

double ring_bytes(const std::string& kind, double bytes, int world) {
  const double n = world;
  if (kind == "all_reduce") return 2 * (n - 1) / n * bytes;
  if (kind == "reduce_scatter") return (n - 1) / n * bytes;
  if (kind == "all_gather") return (n - 1) * bytes;
  return 0;
}

int64_t bytes_of(const std::vector<torch::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts)
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

HeldBytes formula_bytes(int stage, int64_t P, int64_t padded, int world) {
  check_zero_stage(stage);
  const int64_t shard = padded / world;  // S elements
  HeldBytes b;
  b.params = 4 * (stage >= 3 ? shard : P);
  b.grads = 4 * (stage >= 2 ? shard : P);
  b.optimizer = 8 * (stage >= 1 ? shard : P);
  return b;
}

}  // namespace kit
