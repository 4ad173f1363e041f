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

// Host synchronisations: the calls that make the host wait until the device has caught up (a
// blocking copy between the device and the host, a device value read on the host: item(),
// .cpu()). Each one stalls the launch queue, and a GPU step without any lets the host run ahead.
// count_host_syncs() starts counting, host_syncs() is the count so far, in this process:
//  - on fakegpu (this mode): a copy between fakegpu and the CPU with non_blocking false, and a
//    host read of a fakegpu value (_local_scalar_dense, which item() calls), one each. The copies
//    that ATen's CPU fallback makes for every operator it runs (inputs to the CPU and results
//    back) are the fake device's way of computing, not the program's: not counted;
//  - on a GPU: every call CUDA's sync debug mode warns about (torch.cuda.set_sync_debug_mode
//    ("warn"): stream and device synchronisations, blocking copies, item()), counted by a warning
//    handler on the calling thread, which also sees the warnings of the backward passes it runs
//    (autograd replays them there). Those warnings are counted, not printed. PyTorch says this
//    mode does not see everything (torch.distributed's calls, for one);
//  - elsewhere (a CPU run): nothing to wait for, the count stays 0.
void count_host_syncs(torch::Device device);
int64_t host_syncs();

}  // namespace kit::device_check
