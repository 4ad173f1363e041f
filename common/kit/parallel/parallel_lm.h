// kit/parallel/parallel_lm.h — ParallelTransformerLM: exercise 01's language model
// (kit::TransformerLM) with every block split over the mesh's tp group and every sequence over its
// cp group; ParallelBlock, one post-norm Transformer block of it.
//
//   kit::Mesh mesh({.tp = 2});
//   kit::ParallelTransformerLM model(lm_options, mesh, {.seed = seed});
//   model->to(me.device);
//   kit::DistributedDataParallel ddp(model, {.group = &mesh.dp_cp()});  // replicas of this shard
//   auto logits = ddp.forward(kit::cp_shard(tokens, 1, mesh));         // [batch, seq / cp, vocab]
//   auto loss = kit::lm_loss(logits, kit::cp_shard(targets, 1, mesh));
//
// What is split and what is not (Megatron's GPT without its vocabulary-parallel parts):
//   embedding, positions, the norms, the head    whole on every rank (replicated)
//   attention                                    heads split over tp (ParallelAttention)
//   MLP                                          column -> row over tp (ParallelMLP)
//   the sequence                                 split over cp (kit/parallel/context.h)
// so each block all-reduces twice in forward and twice in backward over tp, and under cp
// all-gathers its keys and values once in forward and reduce-scatters their gradient once in
// backward. The replicated weights get the same gradient on every tp rank (their inputs and the
// gradients reaching them are the same everywhere), so nothing is all-reduced for them over tp;
// DDP on mesh.dp_cp() averages every gradient over the ranks that hold the same weights.
//
// Its weights are those of kit::TransformerLM(options) made after torch::manual_seed(seed):
// the constructor draws the same random numbers in the same order (the embedding, one encoder
// layer and its clones, the head), with the default CPU generator set to `seed` for the time
// (its state is put back after), and keeps this rank's slices; a run at tp = N starts from
// exactly the weights of tp = 1 (kit::setup(seed) seeds rank 0 with `seed`). Made on one thread
// at a time: the default generator is the process's. The whole model never exists on one rank:
// the embedding and the head, which are replicated anyway, and one encoder layer at a time.
//
// For the checker, as TransformerLM: each training forward records the fingerprint of this
// rank's weights (kit/check/observe.h; with KIT_TRACE_WEIGHTS=1 the first one saves this rank's
// shards), and to() records the device asked for.
//
// Dropout draws from RandomStreams (kit/parallel/random.h): the embedding's and the residual
// stream's from the replicated stream, attention's and the MLP's hidden one from the parallel
// stream. to(device) remakes both streams for the device's kind, from their seeds.
//
// The model keeps a reference to the mesh (and its layers to its groups): the Mesh must outlive it.
//
// Refused (std::invalid_argument, one line naming the line that made the model): heads, d_model
// or feedforward not divisible by tp; at forward, a sequence (seq / cp x cp) longer than max_len,
// and cp_shard's and cp_positions' refusals (seq not divisible by cp, or by 2 cp for zigzag).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/nn/pimpl.h>

#include "kit/models/transformer_lm.h"  // TransformerLMOptions, TransformerLM
#include "kit/parallel/context.h"       // CpSplit
#include "kit/parallel/layers.h"
#include "kit/parallel/random.h"

namespace kit {

class Mesh;

struct ParallelLMOptions {
  uint64_t seed = 0;  // the weights of TransformerLM made after torch::manual_seed(seed); dropout's streams
  CpSplit cp_split = CpSplit::contiguous;
  // How each block's attention and MLP are split: from the tp = 1 layer (its weights), the column-
  // and the row-parallel layer that make it (kit/parallel/layers.h, ColumnRow). Unset: over
  // mesh.tp(), Megatron's split. Exercise 04's trainer sets both (its TODOs); on mesh.alone() a
  // block part is whole on every rank. Called once per block, inside the constructor.
  std::function<ColumnRow(const torch::nn::MultiheadAttention& full)> attention;
  std::function<ColumnRow(const torch::nn::Linear& linear1, const torch::nn::Linear& linear2)> mlp;
};

// x = norm1(x + dropout(attention(x))); x = norm2(x + dropout(mlp(x))): torch's post-norm
// TransformerEncoderLayer, made from one (its weights sliced), with its attention and MLP split.
class ParallelBlockImpl : public torch::nn::Module {
 public:
  // parallel: its attention and mlp functions, when set, make the block's two parts.
  ParallelBlockImpl(const torch::nn::TransformerEncoderLayer& full, const Mesh& mesh,
                    RandomStreams& streams, CallSite site = {},
                    const ParallelLMOptions& parallel = {});
  // x [batch, seq / cp, d], replicated over tp; mask: ParallelAttention's.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  void load_full(const torch::nn::TransformerEncoderLayer& full);

  ParallelAttention attention{nullptr};
  ParallelMLP mlp{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};

 private:
  RandomStreams& streams_;
  double dropout_;
};
class ParallelBlock : public torch::nn::ModuleHolder<ParallelBlockImpl> {
 public:
  KIT_MODULE_HOLDER(ParallelBlock)  // kit/parallel/layers.h
  ParallelBlock(const torch::nn::TransformerEncoderLayer& full, const Mesh& mesh,
                RandomStreams& streams, CallSite site = {}, const ParallelLMOptions& parallel = {})
      : ModuleHolder(std::make_shared<Impl>(full, mesh, streams, site, parallel)) {}
};

class ParallelTransformerLMImpl : public torch::nn::Module {
 public:
  ParallelTransformerLMImpl(const TransformerLMOptions& options, const Mesh& mesh,
                            ParallelLMOptions parallel = {}, CallSite site = {});
  // tokens [batch, seq / cp]: this cp rank's positions of each sequence (cp_shard) -> logits
  // [batch, seq / cp, vocab], the same on every tp rank.
  torch::Tensor forward(const torch::Tensor& tokens);

  // The whole model's weights, gathered over tp into `full` (a TransformerLM of the same options):
  // collective over tp, every tp rank gets them. For a checkpoint of the whole model (rank 0 saves
  // it: kit::save0) and to compare with tp = 1.
  void gather_into(TransformerLM& full);
  // This rank's slices of `full`'s weights (no collective): a checkpoint of the whole model, at
  // any tp and cp.
  void load_from(TransformerLM& full);

  // Where parameter `name` of this rank (named_parameters()) comes from: the name of the
  // TransformerLM parameter it is cut from ("blocks.0.mlp.linear1.weight" ->
  // "encoder.layers.0.linear1.weight"), and this rank's slice of a tensor shaped like that one (a
  // weight, its gradient, an optimizer moment). For checking shards against tp = 1.
  std::string full_name(const std::string& name) const;
  torch::Tensor slice_of(const std::string& name, const torch::Tensor& full) const;

  // The parameters one rank holds, by the formula: the embedding, head, norms and the row layers'
  // biases whole, the rest of every block divided by tp.
  static int64_t params_per_rank(const TransformerLMOptions& options, int tp);

  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;  // and the streams

  const Mesh& mesh() const { return mesh_; }

  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Linear head{nullptr};
  RandomStreams& streams() { return *streams_; }

 private:
  TransformerLMOptions options_;
  ParallelLMOptions parallel_;
  const Mesh& mesh_;
  CallSite site_;
  std::unique_ptr<RandomStreams> streams_;
  torch::Tensor positions_;  // sinusoidal, [max_len, d_model], as TransformerLM's
  int64_t training_forwards_ = 0;
  struct Origin {
    std::string full_name;
    int64_t dim = 0;
    torch::Tensor index;  // along dim; undefined: the whole tensor
  };
  Origin origin(const std::string& name) const;
};
class ParallelTransformerLM : public torch::nn::ModuleHolder<ParallelTransformerLMImpl> {
 public:
  KIT_MODULE_HOLDER(ParallelTransformerLM)  // kit/parallel/layers.h
  ParallelTransformerLM(const TransformerLMOptions& options, const Mesh& mesh,
                        ParallelLMOptions parallel = {}, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(options, mesh, parallel, site)) {}
};

}  // namespace kit
