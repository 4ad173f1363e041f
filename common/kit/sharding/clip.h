// kit/sharding/clip.h — gradient clipping by global norm when each rank holds only a shard of the
// averaged gradient (ZeRO-1/2/3).
//
// torch.nn.utils.clip_grad_norm_(params, max_norm) takes the L2 norm of ALL the gradients
// together, ||g|| = sqrt(sum of every element squared), and scales every gradient by
// min(1, max_norm / (||g|| + 1e-6)). Under DDP every rank holds the whole averaged gradient after
// backward, so clip_grad_norm_ on the parameters gives the same on every rank (the trainers use
// kit::clip_grad_norm_ of kit/train/clip.h, which leaves the norm on the device).
// Under ZeRO rank r holds only its shard: clipping each shard by its own norm would scale the
// shards differently (another direction, not just another length). The global norm needs every
// shard: each rank sums the squares of its shard, one all-reduce adds those sums up, and every
// rank then scales its shard by the same factor. One collective of one number per step.
//
// The padding of a flat layout (kit/sharding/sharding.h) holds zero gradients: it adds nothing.
#pragma once

#include <vector>

#include <torch/types.h>

#include "kit/runtime/process_group.h"  // ProcessGroup: all_reduce

namespace kit {

// Scales this rank's `shard_grads` in place (undefined ones are skipped) so that the gradient
// they are shards of has a global L2 norm of at most `max_norm` (> 0), as clip_grad_norm_ does.
// Every rank of `group` must call it. Returns the global norm before clipping, a 0-d float tensor
// on the gradients' device: no host synchronisation inside a training step (.item() is yours).
// An option's max_grad_norm: 0 (off) or a norm > 0, returned as it is; otherwise
// std::invalid_argument, one line naming `who`.
double check_max_grad_norm(double max_norm, const char* who);

torch::Tensor clip_shard_grads_(const std::vector<torch::Tensor>& shard_grads, double max_norm,
                                ProcessGroup& group);

}  // namespace kit
