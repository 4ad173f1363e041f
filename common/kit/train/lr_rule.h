// kit/train/lr_rule.h — the learning rate for a bigger global batch, and its warm-up. Plain C++.
//
// N ranks with B images each take one step per N x B images: N times fewer steps per epoch than
// one process with B. To travel as far per epoch, the step must grow with the batch:
//   linear: lr x (global / base)        (Goyal et al. 2017, for SGD)
//   sqrt:   lr x sqrt(global / base)    (keeps the gradient noise per epoch alike; often for Adam)
//   none:   lr as given                 (strong scaling: the global batch does not change)
// A large rate right at the start, from random weights, can diverge; warm-up climbs to it
// linearly over the first steps.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace kit {

enum class LrScaling { none, linear, sqrt };

// "none", "linear" or "sqrt"; anything else throws std::invalid_argument naming the choices.
inline LrScaling parse_lr_scaling(const std::string& name) {
  if (name == "none") return LrScaling::none;
  if (name == "linear") return LrScaling::linear;
  if (name == "sqrt") return LrScaling::sqrt;
  throw std::invalid_argument("unknown learning-rate rule '" + name +
                              "' (choose none, linear or sqrt)");
}

inline const char* to_string(LrScaling rule) {
  return rule == LrScaling::linear ? "linear" : rule == LrScaling::sqrt ? "sqrt" : "none";
}

// The rate for a step over `global_batch` images, when `lr` was tuned for `base_batch`.
inline double scale_lr(double lr, LrScaling rule, int64_t global_batch, int64_t base_batch) {
  const double ratio = static_cast<double>(global_batch) / static_cast<double>(base_batch);
  switch (rule) {
    case LrScaling::linear: return lr * ratio;
    case LrScaling::sqrt: return lr * std::sqrt(ratio);
    case LrScaling::none: break;
  }
  return lr;
}

// The factor of the rate at optimizer step `step` (0-based): (step + 1) / warmup_steps during
// the warm-up, then 1.
inline double warmup_factor(int64_t step, int64_t warmup_steps) {
  if (warmup_steps <= 0 || step >= warmup_steps) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
}

}  // namespace kit
