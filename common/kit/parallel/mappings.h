// kit/parallel/mappings.h — the operators that move activations between ranks inside a model, each
// a torch::autograd::Function with its forward and its backward written out (Megatron-core's
// tensor_parallel/mappings.py; NERSC's distributed/mappings.py). The layers of
// kit/parallel/layers.h are built from them; nothing else in a tensor-parallel model communicates.
//
// Tensor parallelism (the tp group). A layer split over tp ranks sees two kinds of activations:
// replicated ones, the same on every rank (the input of a block), and parallel ones, each rank its
// own slice (the output of a column-parallel linear: its heads, its part of the MLP). Going from
// one to the other needs a collective in one direction of autograd and none in the other:
//
//   copy_to      "f"  forward: identity          backward: all-reduce (sum) the gradient
//   reduce_from  "g"  forward: all-reduce (sum)  backward: identity
//
// copy_to marks where a replicated activation enters a parallel region: every rank uses the whole
// input for its slice, so the input's gradient is the sum of the ranks' contributions. reduce_from
// marks where the region ends: each rank holds a partial sum of the output (a row-parallel
// linear's), the output is their sum, and its gradient is the same on every rank, so nothing needs
// to be sent back. f and g are each other's conjugates: in a block (attention, then MLP) that makes
// two all-reduces in forward (the g's) and two in backward (the f's), Megatron's count.
//
//   gather_from  forward: all-gather along the last dimension   backward: keep this rank's slice
//   scatter_to   forward: keep this rank's slice of the last dimension   backward: all-gather
//
// for a parallel activation that must become whole (a column-parallel linear with gather_output),
// and back.
//
// Context parallelism (the cp group): each rank holds a part of every sequence, and attention
// needs every position's keys and values.
//
//   all_gather_along      forward: all-gather along `dim`   backward: reduce-scatter (sum)
//   reduce_scatter_along  forward: reduce-scatter (sum) along `dim`   backward: all-gather
//
// all_gather_along differs from gather_from in its backward: after gather_from every rank uses the
// gathered tensor alike (it is replicated), so the gradient of this rank's slice is the slice of
// the gradient; after all_gather_along each rank uses the gathered keys and values for its own
// queries, so the gradient of this rank's part is the sum over the ranks of what each one's
// queries sent back: a reduce-scatter.
//
// Every collective goes to the group it is given (never the world) and names `site` in the trace
// and in its errors; the layers pass the line where the trainer made them. A group of one rank
// makes every operator the identity, with no collective. `group` must outlive the autograd graph
// (the Mesh owns the groups for the whole run).
#pragma once

#include <cstdint>

#include <torch/types.h>

#include "kit/runtime/process_group.h"  // ProcessGroup, CallSite

namespace kit {

torch::Tensor copy_to(const torch::Tensor& x, ProcessGroup& group, CallSite site = {});
torch::Tensor reduce_from(const torch::Tensor& x, ProcessGroup& group, CallSite site = {});
torch::Tensor gather_from(const torch::Tensor& x, ProcessGroup& group, CallSite site = {});
torch::Tensor scatter_to(const torch::Tensor& x, ProcessGroup& group, CallSite site = {});

// Along dimension `dim` of x (negative counts from the end): the ranks' parts in group-rank order.
torch::Tensor all_gather_along(const torch::Tensor& x, int64_t dim, ProcessGroup& group,
                               CallSite site = {});
// x's size along `dim` must divide by the group's size; rank r keeps part r of the sum.
torch::Tensor reduce_scatter_along(const torch::Tensor& x, int64_t dim, ProcessGroup& group,
                                   CallSite site = {});

}  // namespace kit
