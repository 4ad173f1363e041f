// kit/perf/fused_adamw.cpp — FusedAdamW (see fused_adamw.h).
#include "kit/perf/fused_adamw.h"

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>

#include "kit/check/observe.h"  // each step, for the checker
#include "kit/compat.h"         // kCpuFusedAdamW: whether this LibTorch has the CPU kernel

namespace kit {

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options)
    : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                std::make_unique<torch::optim::AdamWOptions>(options)) {
  check();
}

FusedAdamW::FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                       torch::optim::AdamWOptions options)
    : Optimizer(groups, std::make_unique<torch::optim::AdamWOptions>(options)) {
  check();
}

void FusedAdamW::check() {
  for (const auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (!(o.lr() >= 0) || !(o.eps() >= 0) || !(o.weight_decay() >= 0) ||
        !(std::get<0>(o.betas()) >= 0 && std::get<0>(o.betas()) < 1) ||
        !(std::get<1>(o.betas()) >= 0 && std::get<1>(o.betas()) < 1))
      throw std::invalid_argument("FusedAdamW: lr, eps and weight_decay must be 0 or more and "
                                  "both betas in [0, 1), as torch::optim::AdamW requires");
    for (const auto& p : group.params()) {
      if (!p.is_floating_point())
        throw std::invalid_argument("FusedAdamW: a parameter of dtype " +
                                    std::string(c10::toString(p.scalar_type())) +
                                    ": the fused kernel updates floating-point tensors only");
      if (p.is_cpu() && !compat::kCpuFusedAdamW)
        throw std::invalid_argument("FusedAdamW: parameters on the CPU need LibTorch 2.4 or newer "
                                    "(at::_fused_adamw_ has no CPU kernel before): use "
                                    "torch::optim::AdamW here");
    }
  }
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  size_t updated = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // The kernel takes lists of tensors on one device and of one dtype: one call per such set.
    struct Lists {
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    };
    std::map<std::pair<std::string, c10::ScalarType>, Lists> lists;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;  // a parameter without gradient is left alone
      if (p.grad().is_sparse())
        throw std::invalid_argument("FusedAdamW: sparse gradients are not supported");
      State& s = moments_[p.unsafeGetTensorImpl()];
      if (!s.step.defined()) {
        s.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Preserve);
        s.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Preserve);
        if (o.amsgrad()) s.max_exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Preserve);
        s.step = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(p.device()));
      }
      Lists& l = lists[{p.device().str(), p.scalar_type()}];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(s.exp_avg);
      l.exp_avg_sqs.push_back(s.exp_avg_sq);
      if (o.amsgrad()) l.max_exp_avg_sqs.push_back(s.max_exp_avg_sq);
      l.steps.push_back(s.step);
    }
    for (auto& [key, l] : lists) {
      // The kernel reads the step count as it is: count this step first (as PyTorch's
      // _fused_adamw does).
      at::_foreach_add_(l.steps, 1);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps,
                        o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(),
                        o.eps(), o.amsgrad(), /*maximize=*/false);
      updated += l.params.size();
    }
  }
  observe::optimizer_step("fused_adamw", updated);
  return loss;
}

void FusedAdamW::save(torch::serialize::OutputArchive&) const {
  throw std::logic_error("FusedAdamW: save() is not supported (use torch::optim::AdamW for a "
                         "trainer that checkpoints its optimizer)");
}

void FusedAdamW::load(torch::serialize::InputArchive&) {
  throw std::logic_error("FusedAdamW: load() is not supported (use torch::optim::AdamW for a "
                         "trainer that checkpoints its optimizer)");
}

}  // namespace kit
