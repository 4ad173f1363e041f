// kit/seq2seq/parallel.h — ParallelSeq2Seq: the summariser's encoder-decoder (kit/seq2seq/model.h)
// with its attention heads and its MLPs split over the mesh's tp group, Megatron's split applied
// to an encoder-decoder (Megatron-LM's T5 splits the same way), from exercise 04's layers.
//
//   kit::Mesh mesh({.tp = 2});
//   kit::RandomStreams streams(seed, mesh);
//   kit::Seq2Seq full(options);                        // the same weights on every rank
//   kit::ParallelSeq2Seq model(full, mesh, streams);   // this rank's slices of them
//   kit::DistributedDataParallel ddp(model, {.group = &mesh.dp()});
//   auto logits = ddp.forward_with([&] { return model->forward(src, tgt_in); });  // [b, T, vocab]
//   model->write_full(full);                           // collective over tp: gathered back
//
// What is split and what is not:
//   the embedding (= the output projection), positions, every LayerNorm   whole on every rank
//   self-attention (encoder, decoder)   heads split: q, k and v one column-parallel layer
//                                       (stacked = 3), the output projection row-parallel
//   cross-attention (decoder)           heads split: q from the decoder's stream and k, v from the
//                                       encoder's memory, two column-parallel layers (their
//                                       inputs differ), the output row-parallel
//   MLP                                 column -> ReLU -> row (ParallelMLP)
// Every tp rank gets the same batch (the tp ranks of one dp rank): the documents, the summaries
// and their padding masks are replicated, as the residual stream is. An encoder layer all-reduces
// twice in forward (its two row layers) and twice in backward (its two column layers' inputs); a
// decoder layer three times each way, plus once in backward for the memory that its
// cross-attention's k and v read (each rank's heads send back a part of the memory's gradient).
// The replicated weights get the same gradient on every tp rank, so nothing is all-reduced for
// them over tp; DDP on mesh.dp() averages every gradient over the ranks that hold the same slice.
//
// Why the vocabulary stays whole: the embedding is also the output projection, so splitting it
// (Megatron's VocabParallelEmbedding and its parallel cross-entropy) would split the loss too; the
// capstone's model is small (8000 x 128 floats, 4 MB), and its logits [batch, T, vocab] are
// computed whole on every tp rank. A larger vocabulary is where that split pays.
//
// Numbers: made from a Seq2Seq, forward() computes what that Seq2Seq computes, up to the order of
// float additions (the row layers' sums over tp, attention batch-first); the tests hold it to
// 1e-5 of the logits and of the weights after training steps, at tp 1, 2 and 4. torch's
// attention keeps a key bias (in_proj_bias's middle third), which shifts every score of a query by
// the same amount and so changes nothing after the softmax; it is kept and trained here too, as
// torch does, so that write_full() gives back what torch's module would hold.
//
// Dropout draws from RandomStreams (kit/parallel/random.h): the embedding's and the residual
// stream's from the replicated stream, attention's and the MLP's hidden one from the parallel
// stream (on a group of one, the replicated one). Other numbers than Seq2Seq's at dropout > 0
// (other generators), the same on every tp rank where they must be.
//
// Refused (std::invalid_argument, one line naming "ParallelSeq2Seq" and the line that made it):
// heads or feedforward not divisible by tp, a mesh with cp > 1 or pp > 1 (not split here), and
// what Seq2Seq::forward refuses. The model keeps references to the mesh and the streams: they
// must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "kit/parallel/layers.h"     // ColumnParallelLinear, RowParallelLinear, ParallelMLP
#include "kit/runtime/process_group.h"  // CallSite
#include "kit/seq2seq/model.h"       // Seq2Seq, Seq2SeqOptions

namespace kit {

class Mesh;
class RandomStreams;

// Attention with its heads split over tp, self or cross: batch-first [batch, len, d].
class Seq2SeqAttentionImpl : public torch::nn::Module {
 public:
  // This rank's heads of `full` (torch's MultiheadAttention); `cross`: q and k, v from different
  // inputs (two column layers), else one stacked column layer.
  Seq2SeqAttentionImpl(const torch::nn::MultiheadAttention& full, bool cross, ProcessGroup& tp,
                       RandomStreams& streams, CallSite site);
  // x [b, L, d] (the queries), memory [b, S, d] (keys and values; x itself for self-attention),
  // mask [L, S] added to the scores (or undefined), key_pad [b, S] bool (true: masked) ->
  // [b, L, d], replicated over tp.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& memory,
                        const torch::Tensor& mask, const torch::Tensor& key_pad);
  // torch's in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias, gathered (collective).
  std::vector<torch::Tensor> full_weights();

  ColumnParallelLinear qkv{nullptr};  // self-attention: q, k, v stacked
  ColumnParallelLinear q{nullptr}, kv{nullptr};  // cross-attention
  RowParallelLinear out{nullptr};

 private:
  RandomStreams& streams_;
  int64_t heads_;  // this rank's
  double dropout_;
  bool cross_;
};
TORCH_MODULE(Seq2SeqAttention);

class ParallelSeq2SeqImpl : public torch::nn::Module {
 public:
  // This rank's slices of `full`'s weights (copied: `full` may go after), its whole embedding,
  // positions and norms. Collective over nothing: every tp rank must pass the same weights (a
  // Seq2Seq made from the same seed, or loaded from the same checkpoint).
  ParallelSeq2SeqImpl(Seq2Seq& full, const Mesh& mesh, RandomStreams& streams,
                      CallSite site = {});

  // Teacher forcing, as Seq2Seq::forward: src [b, S], tgt_in [b, T] -> logits [b, T, vocab],
  // the same on every tp rank.
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& tgt_in);

  // Every weight gathered from the tp ranks into `full` (a Seq2Seq of the same options), under
  // torch's names: for evaluation, greedy decoding and saving, on the whole model. Collective
  // over tp: every tp rank calls it.
  void write_full(Seq2Seq& full);

  // kit::clip_grad_norm_ (kit/train/clip.h) for the split model: the L2 norm of the whole
  // model's gradient (the squares of each split gradient summed over tp, the replicated ones
  // counted once: they are the same on every tp rank), every gradient scaled by max_norm /
  // (norm + 1e-6) where that is below 1. Collective over tp. Returns the norm, a 0-d tensor.
  torch::Tensor clip_grad_norm_(double max_norm);
  // This rank's slices of the split weights (the column layers' weights and biases, the row
  // layers' weights); every other parameter is whole on every tp rank.
  const std::vector<torch::Tensor>& split_parameters() const { return split_; }

  const Seq2SeqOptions& options() const { return options_; }
  // Module::to, told to the checker first (kit/check/observe.h), as Seq2Seq's.
  void to(torch::Device device, bool non_blocking = false) override;
  using torch::nn::Module::to;

 private:
  struct Layer;  // one encoder or decoder layer (parallel.cpp)
  torch::Tensor embed(const torch::Tensor& ids);  // [b, len] -> [b, len, d]

  Seq2SeqOptions options_;
  ProcessGroup& tp_;
  RandomStreams& streams_;
  CallSite site_;
  torch::nn::Embedding embed_{nullptr};
  torch::Tensor positions_;
  std::vector<std::shared_ptr<Layer>> encoder_, decoder_;
  torch::nn::LayerNorm encoder_norm_{nullptr}, decoder_norm_{nullptr};
  std::vector<torch::Tensor> split_;  // split_parameters()
  std::vector<torch::Tensor> whole_;  // every other parameter (the replicated ones)
  int64_t training_forwards_ = 0;
};
// The holder, with the calling line filled in at the trainer's (KIT_MODULE_HOLDER, layers.h).
class ParallelSeq2Seq : public torch::nn::ModuleHolder<ParallelSeq2SeqImpl> {
 public:
  KIT_MODULE_HOLDER(ParallelSeq2Seq)
  ParallelSeq2Seq(Seq2Seq& full, const Mesh& mesh, RandomStreams& streams, CallSite site = {})
      : ModuleHolder(std::make_shared<Impl>(full, mesh, streams, site)) {}
};

}  // namespace kit
