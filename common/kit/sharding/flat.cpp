// kit/sharding/flat.cpp — a model's weights and gradients as flat buffers (see flat.h).
#include "kit/sharding/flat.h"

#include <stdexcept>

#include <torch/torch.h>

#include "kit/runtime/distributed.h"  // group_or_world

namespace kit {
namespace {

std::vector<torch::Tensor> trainable(const torch::nn::Module& model, const CallSite& site) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) out.push_back(p);
  if (out.empty())
    throw std::invalid_argument("FlatParameters: the model has no trainable parameters (" +
                                site.str() + ")");
  return out;
}

// What is not sharded but must start alike on every rank: the frozen parameters and the buffers.
std::vector<torch::Tensor> unsharded(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters())
    if (!p.requires_grad()) out.push_back(p);
  for (const auto& b : model.buffers()) out.push_back(b);
  return out;
}

}  // namespace

FlatParameters::FlatParameters(const torch::nn::Module& model, ProcessGroup* group, CallSite site)
    : keep_group_(group_or_world(group, "FlatParameters", &site)),
      group_(keep_group_.get()),
      params_(trainable(model, site)),
      claim_(params_, "kit::FlatParameters (ZeRO by hand)"),
      layout_(params_, group_->size(), group_->rank()) {
  // Rank 0's weights in one flat broadcast; that flat vector then IS the weights: set_data keeps
  // each parameter (the model holds it) and frees its old storage.
  torch::NoGradGuard no_grad;
  params_flat_ = layout_.flatten(params_);
  if (group_->size() > 1) group_->broadcast(params_flat_, 0);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(layout_.part(params_flat_, i));
  broadcast_from_rank0(*group_, unsharded(model));
  for (auto& p : params_)
    hooks_.push_back(p.register_hook([this](const torch::Tensor&) { make_grads(); }));
}

FlatParameters::~FlatParameters() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_hook(hooks_[i]);
}

void FlatParameters::make_grads() {
  if (grads_flat_.defined()) return;
  torch::NoGradGuard no_grad;
  grads_flat_ = torch::zeros({layout_.padded()}, params_flat_.options());
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].mutable_grad() = layout_.part(grads_flat_, i);
}

torch::Tensor& FlatParameters::grads(CallSite site) {
  if (!grads_flat_.defined())
    throw std::logic_error("FlatParameters::grads(): there is no gradient (none since the last "
                           "drop_grads(), or no backward yet) (" + site.str() + ")");
  return grads_flat_;
}

void FlatParameters::drop_grads() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  grads_flat_ = torch::Tensor();
}

HeldBytes FlatParameters::held(const ShardedAdamW& adamw, const torch::Tensor& kept_grads) const {
  HeldBytes b;
  b.params = bytes_of(params_);
  std::vector<torch::Tensor> grads{kept_grads};
  for (const auto& p : params_) grads.push_back(p.grad());
  b.grads = bytes_of(grads);
  b.optimizer = adamw.bytes();
  return b;
}

}  // namespace kit
