// kit/train/clip.cpp — clip_grad_norm_() with the norm on the device (see clip.h). The body is
// LibTorch's torch::nn::utils::clip_grad_norm_ (torch/nn/utils/clip_grad.h) without its final
// .item(), so that the two scale the gradients by the same number.
#include "kit/train/clip.h"

#include <limits>

#include <torch/torch.h>

namespace kit {

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm,
                              double norm_type) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad().data());
  if (grads.empty()) return torch::zeros({});  // torch's: 0.0 (C++), tensor(0.) (Python)

  torch::Tensor total;
  if (norm_type == std::numeric_limits<double>::infinity()) {
    std::vector<torch::Tensor> norms;
    for (const auto& g : grads) norms.push_back(g.abs().max());
    total = norms.size() == 1 ? norms[0] : torch::max(torch::stack(norms));
  } else if (norm_type == 0) {
    // The number of gradients, in the default dtype as torch's (which makes it on the CPU; here
    // it is on the gradients' device: the same number).
    total = torch::full({}, static_cast<double>(grads.size()), torch::TensorOptions().device(grads[0].device()));
  } else {
    std::vector<torch::Tensor> norms;
    for (const auto& g : grads) norms.push_back(g.norm(norm_type));
    total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(norm_type);
  }
  // torch's factor, clamped at 1: a gradient already within max_norm is left as it is.
  auto factor = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(factor);
  return total;
}

}  // namespace kit
