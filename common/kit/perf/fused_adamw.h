// kit/perf/fused_adamw.h — FusedAdamW: torch::optim::AdamW's update in one fused kernel per device
// and dtype (ATen's at::_fused_adamw_, what torch.optim.AdamW(fused=True) calls).
//
// torch::optim::AdamW updates one parameter at a time, with about ten tensor operations each (the
// moments' mul_/add_, a sqrt, a division, the weight decay): for a model of P parameter tensors
// that is ~10 P small kernels per step, each reading and writing its tensors from memory. The
// fused kernel takes every parameter, gradient and moment in lists and does the whole update in
// one pass over memory. The step is bandwidth-bound either way, so the gain is the launches and
// the passes saved: large for many small tensors (and on a GPU, where each launch costs a few
// microseconds), small where a few big matmuls dominate the step (NERSC's A100 run: 37 -> 40
// samples/s with the fused Adam and torch.compile together).
//
//   kit::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(5e-4));
//   ... loss.backward(); optimizer.step();   // any torch::optim::Optimizer code works with it
//
// The same arithmetic as torch::optim::AdamW (bias-corrected moments, decoupled weight decay,
// amsgrad), computed in fp32 in one expression: the results agree to rounding
// (unit.FusedAdamW.MatchesTorchAdamW bounds the difference). The step counts are float tensors on
// the parameters' device, as PyTorch keeps them for its fused kernels. save()/load() are refused
// (no exercise checkpoints this optimizer). CPU parameters need LibTorch 2.4 or newer (the
// kernel's CPU version); older ones refuse them in one line.
#pragma once

#include <unordered_map>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

namespace kit {

class FusedAdamW : public torch::optim::Optimizer {
 public:
  explicit FusedAdamW(std::vector<torch::Tensor> params,
                      torch::optim::AdamWOptions options = {});
  explicit FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                      torch::optim::AdamWOptions options = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void check();
  // Per parameter (by its TensorImpl): the moments, the largest second moment (amsgrad), the
  // step count.
  struct State {
    torch::Tensor exp_avg, exp_avg_sq, max_exp_avg_sq, step;
  };
  std::unordered_map<const void*, State> moments_;
};

}  // namespace kit
