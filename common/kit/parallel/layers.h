// kit/parallel/layers.h — the tensor-parallel layers (Megatron-core's tensor_parallel/layers.py and
// its attention and MLP): each holds this rank's slice of a tp = 1 layer and communicates only
// through kit/parallel/mappings.h, on the group it was given.
//
//   ColumnParallelLinear  y = x W^T + b with W's rows (the output features) split over tp: rank r
//                         keeps rows [r out/tp, (r+1) out/tp). Input replicated, output parallel
//                         (this rank's columns of y). Forward: copy_to (f) on the input, nothing
//                         sent; backward: the input's gradient all-reduced.
//   RowParallelLinear     W's columns (the input features) split: rank r keeps columns
//                         [r in/tp, (r+1) in/tp). Input parallel, output replicated: each rank's
//                         x_r W_r^T is a partial sum of y, reduce_from (g) adds them up; the bias
//                         (whole on every rank) is added once, after the sum.
//   ParallelAttention     the heads split over tp: q, k and v column-parallel (each rank computes
//                         its heads' whole attention, nothing sent), the output projection
//                         row-parallel. With cp > 1 every rank holds a part of the sequence: its
//                         keys and values are all-gathered over cp (all_gather_along; backward
//                         reduce-scatters their gradients) and masked by position.
//   ParallelMLP           column -> ReLU -> row: the hidden layer never leaves its rank.
//
// Column then row is the pattern: the column layer's parallel output is exactly the row layer's
// parallel input, so a block sends nothing between them, and a Transformer block (attention, then
// MLP) costs two all-reduces of [batch, seq, d_model] in forward (the two row layers' g) and two in
// backward (the two column layers' f), whatever tp is.
//
// Every layer is made from the tp = 1 layer it splits (a torch::nn::Linear, MultiheadAttention),
// whose weights it slices: made from the same weights, tp = N computes what tp = 1 computes, up to
// the order of float additions in the row layers' sums. load_full() copies this rank's slice of other
// full weights in (a checkpoint of the tp = 1 model); full_weight() and full_bias() gather them
// back (collective over tp). `site` (the line where the trainer made the layer) is named in the
// trace of every collective the layer makes, in forward and in backward, and in its errors. A
// layer keeps a reference to its group (and ParallelAttention to the mesh and the streams): they
// must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "kit/runtime/process_group.h"  // ProcessGroup, CallSite

namespace kit {

class Mesh;
class RandomStreams;

// The holder of a module (what TORCH_MODULE declares), whose constructors are written out below
// each one instead of forwarded, so that their CallSite is filled in at the trainer's line:
// TORCH_MODULE's forwarding constructor would fill it in inside LibTorch's pimpl.h.
#define KIT_MODULE_HOLDER(Name)                                                            \
  using Impl = Name##Impl;                                                                 \
  Name(std::nullptr_t) : torch::nn::ModuleHolder<Impl>(nullptr) {}                         \
  Name(std::shared_ptr<Impl> impl) : torch::nn::ModuleHolder<Impl>(std::move(impl)) {}

struct ColumnParallelOptions {
  // The weight is `stacked` equal blocks of rows, each split over tp on its own: torch's attention
  // stacks q, k and v in one in_proj_weight [3 d, d] (stacked = 3), and rank r keeps its heads' rows
  // of each of the three.
  int64_t stacked = 1;
  bool gather_output = false;  // gather_from the output: whole on every rank (then replicated)
};

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // This rank's rows of a tp = 1 layer's weight [out, in] and bias [out] (copied).
  ColumnParallelLinearImpl(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                           ProcessGroup& tp, ColumnParallelOptions options = {}, CallSite site = {});
  ColumnParallelLinearImpl(const torch::nn::Linear& full, ProcessGroup& tp,
                           ColumnParallelOptions options = {}, CallSite site = {})
      : ColumnParallelLinearImpl(full->weight, full->bias, tp, options, site) {}
  // The same, from a torch::nn::Linear(in, out) made here (torch's initialisation: every tp rank's
  // default generator must be in the same state, or the slices come from different layers).
  ColumnParallelLinearImpl(int64_t in, int64_t out, ProcessGroup& tp,
                           ColumnParallelOptions options = {}, CallSite site = {});
  // x [..., in], the same on every tp rank -> [..., out / tp] (gather_output: [..., out]).
  torch::Tensor forward(const torch::Tensor& x);
  // The same with `bias` (this rank's part, [out / tp]) in place of the layer's own.
  torch::Tensor forward_with_bias(const torch::Tensor& x, const torch::Tensor& bias);
  void load_full(const torch::Tensor& full_weight, const torch::Tensor& full_bias);  // no collective
  torch::Tensor full_weight();  // [out, in], every tp rank; collective
  torch::Tensor full_bias();    // [out]
  // Rows of the full weight that this rank holds (in order), for tests and reports.
  torch::Tensor rows() const;
  ProcessGroup& group() const { return tp_; }  // the ranks it is split over
  const ColumnParallelOptions& options() const { return options_; }
  const CallSite& site() const { return site_; }  // where the trainer made it

  torch::Tensor weight, bias;  // [out / tp, in], [out / tp]

 private:
  ProcessGroup& tp_;
  ColumnParallelOptions options_;
  CallSite site_;
};
class ColumnParallelLinear : public torch::nn::ModuleHolder<ColumnParallelLinearImpl> {
 public:
  KIT_MODULE_HOLDER(ColumnParallelLinear)
  ColumnParallelLinear(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                       ProcessGroup& tp, ColumnParallelOptions options = {}, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(full_weight, full_bias, tp, options, site)) {}
  ColumnParallelLinear(const torch::nn::Linear& full, ProcessGroup& tp,
                       ColumnParallelOptions options = {}, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(full, tp, options, site)) {}
  ColumnParallelLinear(int64_t in, int64_t out, ProcessGroup& tp, ColumnParallelOptions options = {},
                       CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(in, out, tp, options, site)) {}
};

struct RowParallelOptions {
  bool input_is_parallel = true;  // false: the input is whole, scatter_to keeps this rank's part
};

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  // This rank's columns of a tp = 1 layer's weight [out, in], and its whole bias [out].
  RowParallelLinearImpl(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                        ProcessGroup& tp, RowParallelOptions options = {}, CallSite site = {});
  RowParallelLinearImpl(const torch::nn::Linear& full, ProcessGroup& tp,
                        RowParallelOptions options = {}, CallSite site = {})
      : RowParallelLinearImpl(full->weight, full->bias, tp, options, site) {}
  RowParallelLinearImpl(int64_t in, int64_t out, ProcessGroup& tp, RowParallelOptions options = {},
                        CallSite site = {});
  // x [..., in / tp], this rank's part -> [..., out], the same on every tp rank.
  torch::Tensor forward(const torch::Tensor& x);
  void load_full(const torch::Tensor& full_weight, const torch::Tensor& full_bias);
  torch::Tensor full_weight();  // [out, in]; collective
  torch::Tensor full_bias() { return bias.detach().clone(); }
  int tp_rank() const { return tp_.rank(); }  // which columns: [tp_rank in/tp, (tp_rank + 1) in/tp)
  ProcessGroup& group() const { return tp_; }
  const RowParallelOptions& options() const { return options_; }

  torch::Tensor weight, bias;  // [out, in / tp], [out]

 private:
  ProcessGroup& tp_;
  RowParallelOptions options_;
  CallSite site_;
};
class RowParallelLinear : public torch::nn::ModuleHolder<RowParallelLinearImpl> {
 public:
  KIT_MODULE_HOLDER(RowParallelLinear)
  RowParallelLinear(const torch::Tensor& full_weight, const torch::Tensor& full_bias,
                    ProcessGroup& tp, RowParallelOptions options = {}, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(full_weight, full_bias, tp, options, site)) {}
  RowParallelLinear(const torch::nn::Linear& full, ProcessGroup& tp, RowParallelOptions options = {},
                    CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(full, tp, options, site)) {}
  RowParallelLinear(int64_t in, int64_t out, ProcessGroup& tp, RowParallelOptions options = {},
                    CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(in, out, tp, options, site)) {}
};

// A block's attention or MLP as the trainer splits it: the column-parallel layer that opens it and
// the row-parallel layer that closes it, each made from the tp = 1 layer's weights on a group of
// the trainer's choice (kit/parallel/parallel_lm.h's ParallelLMOptions::attention and ::mlp;
// exercise 04's TODOs). On mesh.tp() they are Megatron's split; on mesh.alone(), a group of this
// rank only, both are whole: every rank holds and computes the whole layer, and sends nothing.
struct ColumnRow {
  ColumnParallelLinear column;
  RowParallelLinear row;
};

// Self-attention with the heads split over mesh.tp() and the sequence over mesh.cp(): made from a
// torch::nn::MultiheadAttention (tp = 1; batch_first or not, it only gives the weights).
// Attention's key bias is held at zero, as kit::TransformerLM holds it (kit/models/transformer_lm.h
// says why): the forward uses zeros in its place, so its gradient is exactly zero.
class ParallelAttentionImpl : public torch::nn::Module {
 public:
  ParallelAttentionImpl(const torch::nn::MultiheadAttention& full, const Mesh& mesh,
                        RandomStreams& streams, CallSite site = {});
  // From q, k and v's layer (ColumnParallelOptions{.stacked = 3}) and the output projection, as the
  // trainer split them: this rank computes heads / (the column layer's group size) heads, the
  // heads whose rows of q, k and v it holds. Refused (one line naming the trainer's line that made
  // the column layer; its collectives over cp name that line too): a split column layer
  // that is not stacked = 3 (it would hold all of q and part of k, not its heads; a whole one holds
  // every row either way), or that gathers its output; the two layers split over groups of
  // different sizes; heads not divisible by the group's size.
  ParallelAttentionImpl(ColumnRow layers, int64_t heads, double dropout, const Mesh& mesh,
                        RandomStreams& streams);
  // x [batch, seq / cp, d], replicated over tp; mask [seq / cp, seq]: added to the scores of this
  // rank's queries against every key in the cp group's order (-inf: not seen) -> [batch, seq / cp,
  // d], replicated over tp.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  void load_full(const torch::nn::MultiheadAttention& full);

  ColumnParallelLinear qkv{nullptr};  // this rank's heads' q, k and v
  RowParallelLinear out{nullptr};

 private:
  const Mesh& mesh_;
  RandomStreams& streams_;
  int64_t heads_;  // this rank's
  double dropout_;
  CallSite site_;  // the cp collectives': where q, k and v's layer was made
};
class ParallelAttention : public torch::nn::ModuleHolder<ParallelAttentionImpl> {
 public:
  KIT_MODULE_HOLDER(ParallelAttention)
  ParallelAttention(const torch::nn::MultiheadAttention& full, const Mesh& mesh,
                    RandomStreams& streams, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(full, mesh, streams, site)) {}
  ParallelAttention(ColumnRow layers, int64_t heads, double dropout, const Mesh& mesh,
                    RandomStreams& streams)
      : ModuleHolder(std::make_shared<Impl>(std::move(layers), heads, dropout, mesh, streams)) {}
};

// linear1 column-parallel, ReLU and dropout on this rank's hidden slice (the parallel stream;
// the replicated one where the layers are whole, on a group of one rank), linear2 row-parallel.
class ParallelMLPImpl : public torch::nn::Module {
 public:
  ParallelMLPImpl(const torch::nn::Linear& linear1, const torch::nn::Linear& linear2,
                  ProcessGroup& tp, RandomStreams& streams, double dropout, CallSite site = {});
  // From the two layers as the trainer split them. Refused (one line naming the trainer's line
  // that made linear1): the two split
  // over groups of different sizes (the column layer's slice of the hidden layer is the row
  // layer's input), a column layer that gathers its output, a row layer that scatters its input.
  ParallelMLPImpl(ColumnRow layers, RandomStreams& streams, double dropout);
  torch::Tensor forward(const torch::Tensor& x);  // [..., d] -> [..., d], replicated over tp

  ColumnParallelLinear linear1{nullptr};
  RowParallelLinear linear2{nullptr};

 private:
  RandomStreams& streams_;
  double dropout_;
};
class ParallelMLP : public torch::nn::ModuleHolder<ParallelMLPImpl> {
 public:
  KIT_MODULE_HOLDER(ParallelMLP)
  ParallelMLP(const torch::nn::Linear& linear1, const torch::nn::Linear& linear2, ProcessGroup& tp,
              RandomStreams& streams, double dropout, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(linear1, linear2, tp, streams, dropout, site)) {}
  ParallelMLP(ColumnRow layers, RandomStreams& streams, double dropout)
      : ModuleHolder(std::make_shared<Impl>(std::move(layers), streams, dropout)) {}
};

}  // namespace kit
