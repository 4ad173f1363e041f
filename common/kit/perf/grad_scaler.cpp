// kit/perf/grad_scaler.cpp — GradScaler (see grad_scaler.h), torch.amp.GradScaler's logic.
#include "kit/perf/grad_scaler.h"

#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace kit {

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  if (options_.enabled && !(options_.init_scale > 0 && options_.growth_factor > 1 &&
                            options_.backoff_factor > 0 && options_.backoff_factor < 1 &&
                            options_.growth_interval > 0))
    throw std::invalid_argument(
        "GradScaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
        "growth_interval > 0 are needed");
}

void GradScaler::lazy_init(const torch::Device& device) {
  if (scale_.defined()) return;
  scale_ = torch::full({1}, options_.init_scale, torch::TensorOptions().device(device));
  growth_tracker_ = torch::zeros({1}, torch::TensorOptions().device(device).dtype(torch::kInt));
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!enabled()) return loss;
  lazy_init(loss.device());
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!enabled()) return;
  PerOptimizer& s = state_[&optimizer];
  if (s.unscaled)
    throw std::logic_error("GradScaler: unscale() has already been called on this optimizer "
                           "since the last update()");
  if (s.stepped)
    throw std::logic_error("GradScaler: unscale() after step() (call it before, or not at all)");
  if (!scale_.defined())
    throw std::logic_error("GradScaler: unscale() before any scale(): there is nothing to unscale");
  // 1/S in float64 then float32, as PyTorch (exact for powers of two).
  const torch::Tensor inv = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // One kernel call per device and dtype of the gradients (the ATen op's requirement).
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<torch::Tensor>> groups;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.grad().defined()) {
        if (p.grad().scalar_type() == torch::kHalf)
          throw std::invalid_argument("GradScaler: a gradient in fp16: the weights must stay fp32 "
                                      "under autocast (do not convert the model to fp16)");
        groups[{p.grad().device().str(), p.grad().scalar_type()}].push_back(p.grad());
      }
  s.found_inf = torch::zeros({1}, scale_.options());
  for (auto& [key, grads] : groups) {
    const torch::Device d = grads.front().device();
    torch::Tensor found = torch::zeros({1}, torch::TensorOptions().device(d));
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv.to(d));
    s.found_inf += found.to(s.found_inf.device());
  }
  s.unscaled = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled()) {
    optimizer.step();
    return true;
  }
  PerOptimizer& s = state_[&optimizer];
  if (s.stepped)
    throw std::logic_error("GradScaler: step() has already been called since the last update()");
  if (!s.unscaled) unscale(optimizer);
  s.stepped = true;
  // Like PyTorch: the host reads the flag (one synchronisation per step on a GPU).
  if (s.found_inf.item<double>() != 0) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!enabled() || !scale_.defined()) return;
  torch::Tensor found = torch::zeros({1}, scale_.options());
  for (auto& [optimizer, s] : state_)
    if (s.found_inf.defined()) found += s.found_inf;
  if (state_.empty())
    throw std::logic_error("GradScaler: update() without unscale() or step() since the last one");
  at::_amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  state_.clear();
}

double GradScaler::scale_value() const {
  return scale_.defined() ? scale_.item<double>() : options_.init_scale;
}

}  // namespace kit
