// kit/perf/grad_scaler.h — GradScaler: fp16 training's loss scaling, as torch.amp.GradScaler.
//
// fp16 has 5 exponent bits: a gradient below 6e-8 becomes 0 in it. The scaler multiplies the
// loss by a large factor S before backward, so that the gradients backward computes in fp16 are
// S times larger and stay representable; before the optimizer uses them they are divided by S
// again (in fp32: the weights' gradients are fp32). When S was too large, some gradient overflowed
// to inf or NaN: that step is skipped and S halved. After 2000 steps without one, S doubles.
//
//   kit::GradScaler scaler;                        // S = 65536 (enabled: false = a no-op)
//   scaler.scale(loss).backward();                 // gradients x S
//   scaler.unscale(optimizer);                     // / S, and look for inf/NaN: before clipping
//   torch::nn::utils::clip_grad_norm_(params, 1);  // clips the true gradients
//   scaler.step(optimizer);                        // optimizer.step(), unless one was inf/NaN
//   scaler.update();                               // S / 2 after an inf, S x 2 after 2000 good steps
//
// The same ATen kernels as PyTorch (_amp_foreach_non_finite_check_and_unscale_,
// _amp_update_scale_), so the same scales and the same skipped steps. Their CPU kernels exist
// from LibTorch 2.3 on (the tests run the scaler on CPU tensors); on a GPU every supported one
// has them. bf16 needs no scaler: it has fp32's range.
#pragma once

#include <cstdint>
#include <unordered_map>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

namespace kit {

// torch.amp.GradScaler's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;    // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // finite steps in a row before the scale grows
  bool enabled = true;             // false: every call passes through (fp32, bf16)
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  // loss x S (S lives on the loss's device from the first call on); the loss itself when disabled.
  torch::Tensor scale(const torch::Tensor& loss);
  // Divides every gradient of the optimizer's parameters by S, in place, and notes whether any is
  // inf or NaN. At most once per optimizer between two update() calls (std::logic_error, as
  // PyTorch's RuntimeError); step() calls it when it was not.
  void unscale(torch::optim::Optimizer& optimizer);
  // optimizer.step() unless a gradient was inf or NaN; true when the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // The next scale: backoff_factor x S after a step with inf/NaN, growth_factor x S after
  // growth_interval steps in a row without. Once per iteration, after the optimizers' steps.
  void update();
  // The current S (reads it from the device: not for every step of a fast loop).
  double scale_value() const;

 private:
  void lazy_init(const torch::Device& device);

  GradScalerOptions options_;
  torch::Tensor scale_, growth_tracker_;  // float [1], int32 [1], on the loss's device
  // Per optimizer since the last update(): whether unscale() ran, and its found-inf flag (float
  // [1]: 1 when a gradient was inf or NaN).
  struct PerOptimizer {
    bool unscaled = false, stepped = false;
    torch::Tensor found_inf;
  };
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> state_;
};

}  // namespace kit
