// kit/train/clip.h — clip_grad_norm_(): gradient clipping by global norm, the norm returned as a
// tensor on the gradients' device, as Python's torch.nn.utils.clip_grad_norm_ returns it.
//
//   loss.backward();
//   kit::clip_grad_norm_(model->parameters(), args.clip_grad);   // in place of torch::nn::utils'
//   optimizer.step();
//
// Why: LibTorch's C++ torch::nn::utils::clip_grad_norm_ returns the norm as a host double, so it
// calls .item() (its header says so), and every step's host waits there until the device has
// finished backward: no more launches are queued meanwhile, and the GPU idles at the start of the
// next step. This one computes what the C++ one computes, operation for operation (each
// gradient's norm, the norm of those norms, the factor max_norm / (norm + 1e-6) clamped at 1,
// multiplied into every gradient), so the gradients come out bit for bit the same
// (tests/unit/clip_test.cpp checks it at zero tolerance against torch::nn::utils::clip_grad_norm_),
// and it reads nothing back: the norm is a 0-d tensor on the gradients' device. Read it (.item())
// where a wait does not matter, at a print. Like both of torch's, it does not check that the norm
// is finite (error_if_nonfinite = true would read it on the host).
//
// Under DDP every rank holds the whole averaged gradient after backward, so every rank clips
// alike. Under ZeRO a rank holds a shard of it: kit/sharding/clip.h.
#pragma once

#include <vector>

#include <torch/types.h>

namespace kit {

// Scales the gradients of `parameters` in place (parameters without one are skipped) so that
// their global norm of order `norm_type` (2: L2; infinity: the largest magnitude) is at most
// `max_norm`. Returns that norm before clipping, a 0-d tensor on the gradients' device (a 0 on the
// CPU when no parameter has a gradient).
torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm,
                              double norm_type = 2.0);

}  // namespace kit
