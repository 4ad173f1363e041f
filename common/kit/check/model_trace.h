// kit/check/model_trace.h — what a model tells the checker (kit/check/trace.h) about itself: its
// device, the fingerprint of its weights at each training forward, its buffers at an evaluation.
// The models call them through kit/check/observe.h (observe::model_to(), training_forward(),
// evaluation()), every kit model (TransformerLM, ResNet) alike, so that `kit check` judges any
// exercise's model alike; only kit/check/ includes this header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace kit::trace {

// "model_to device=...": on a CPU-only machine a wrongly numbered device (cpu:1 where setup()
// gave cpu) leaves no other trace, because CPU tensors always report plain "cpu".
void record_model_to(torch::Device device);

// At the start of a training forward: "forward step=N params=<sum of every weight>
// buffers=<sum of every floating-point buffer> device=...". Ranks whose replicas are in sync
// record the same params at the same step; the same buffers only where something made them equal
// (DDP's broadcast_buffers at ddp.forward: the checker tells a forward that bypassed it by them). At step 1, with
// KIT_TRACE_WEIGHTS=1, also writes the weights that step starts from (after DDP's broadcast:
// rank 0's on every rank) as a name -> tensor dictionary that Python's torch.load reads.
// No-op while tracing is off.
void record_training_forward(const torch::nn::Module& model, int64_t step);

// At the first forward of an evaluation: "evaluate buffers=<sum of every floating-point buffer>"
// (batch norm's running statistics). Ranks that evaluate the same model record the same sum.
// No-op while tracing is off.
void record_evaluation(const torch::nn::Module& model);

// With KIT_TRACE_WEIGHTS=1, after the first backward (DDP's averages, before the optimizer's
// step): each parameter of `params` (named `names`) and its gradient, in "first-backward-rank<r>.pt"
// beside the trace, a torch::serialize archive whose keys are "w<i>" (the weight) and "g<i>" (its
// gradient) for the i-th name, and the names, one a line, in "first-backward-rank<r>.names" (an
// archive's keys cannot hold the dots of a name). common/tools/checklib/archive.py reads it
// without torch. No-op otherwise, and after step 1.
void record_gradients(int64_t step, const std::vector<std::string>& names,
                      const std::vector<torch::Tensor>& params);

}  // namespace kit::trace
