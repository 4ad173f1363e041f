// kit/runtime/device_check.h — KIT_DEVICE_CHECK=nccl: NCCL's rule, "every tensor a collective is
// given lives on this rank's device", enforced on a CPU-only machine with Gloo.
//
// Why: NCCL moves only GPU tensors. A tensor made on the host (torch::tensor({...}) for a stop
// flag, a debug descriptor) works on Gloo, so CPU CI passes, and the first GPU run dies at step
// 1. On a CPU machine every tensor is on the CPU, so "on the wrong device" cannot be seen: this
// mode makes a second device to be wrong about.
//
// How: the rank's device becomes "fakegpu:0", LibTorch's PrivateUse1 device type under another
// name. Its memory is ordinary host memory; a handful of kernels are native (allocation, copies,
// views: the ones whose result must share memory with their input, which a fallback cannot do) and
// every other operator runs the CPU kernel through ATen's cpu_fallback (copy in, compute, copy
// back). So the trainer runs unchanged, only slower, and a tensor that was never moved to the
// device stays a CPU tensor, as it would on a GPU node. The kit's ProcessGroup then refuses, with
// one line naming the call, any tensor not on fakegpu:0, and hands Gloo a CPU view of the same
// memory (host_alias), so the collective itself is Gloo's, in place.
//
// Chosen over a dry run on `meta` (no values: the stop flag, the descriptors and the losses would
// all be lies, and the run could not checkpoint or resume) and over tagging allocations (every
// host tensor is made by the same CPU allocator as the trainer's tensors: nothing to tell apart).
#pragma once

#include <string>

#include <torch/types.h>

namespace kit::device_check {

// KIT_DEVICE_CHECK: "" (off) or "nccl"; anything else is a one-line std::runtime_error.
bool enabled();

// The stand-in for this rank's GPU, "fakegpu:0" (registered with LibTorch on the first call).
torch::Device device();

// A CPU tensor over the same memory as `t` (same sizes, strides and offset): what Gloo is given
// for a tensor on fakegpu. A CPU tensor is returned as it is.
torch::Tensor host_alias(const torch::Tensor& t);

}  // namespace kit::device_check
