// kit/pipeline/stage.h — exercise 01's Transformer LM cut into chunks along its depth: which blocks
// each chunk runs, and this rank's chunks taken out of the whole model.
//
//   auto chunks = kit::pp::take_chunks(model, mesh.pp_size(), /*v=*/1, mesh.pp_rank());
//   torch::Tensor y = chunks[0].forward(x);   // x: tokens on the first chunk, else activations
//
// The model is a chain of units (TransformerLM::units(): the embedding, each block, the output
// layer). Chunk c of C runs a run of consecutive blocks: the first chunk also the embedding, the
// last also the output layer, whose logits the loss takes. Blocks are shared out as evenly as
// they go, the first chunks one more when they do not divide (the last chunk also has the output
// layer and the loss; the first's embedding is a lookup). With v chunks per rank (interleaved
// 1F1B), rank r holds chunks r, r + pp, ... (kit/pipeline/schedule.h).
//
// Every rank builds the whole model from the same seed, so each chunk starts from the weights of
// the unsplit model (what makes a pipelined run's losses those of one rank); take_chunks() then
// frees the weights of the other ranks' chunks: each rank holds about 1 / pp of the model.
// Between chunks travels one tensor, [seq, micro-batch, d_model] (the encoder's layout).
#pragma once

#include <string>
#include <vector>

#include <torch/types.h>

#include "kit/models/transformer_lm.h"
#include "kit/runtime/distributed.h"  // CallSite

namespace kit::pp {

// The whole model as rank 0 of a one-rank run makes it (kit::setup(seed) seeds rank 0 with
// `seed`): made with torch's default CPU generator set to `seed` for the time, its state put back
// after, so that every rank starts from the same weights without a broadcast. Made on one thread
// at a time: the default generator is the process's.
TransformerLM whole_model(const TransformerLMOptions& options, uint64_t seed);

// Blocks per chunk. Throws std::invalid_argument (one line) when there are more chunks than
// blocks, or fewer than one.
std::vector<int> split_layers(int layers, int chunks);
// "chunk 0: embedding, blocks 0-2 | chunk 1: blocks 3-4, output layer": what the trainer prints.
std::string describe_split(int layers, int chunks);

struct Chunk {
  int index = 0;          // along the pipeline
  bool first = false;     // runs the embedding: its input is the tokens
  bool last = false;      // runs the output layer: its output is the logits
  std::vector<TransformerLMImpl::Unit> units;
  std::string what;       // "blocks 3-4, output layer"
  // Its units in order. `micro`, the micro-batch's number, goes to the run trace with the
  // forward's start and end ("pp kind=F stage=<chunk> mb=<micro> t0= t1="): the order `kit check`
  // compares with the schedule's, and the boxes of the timeline.
  torch::Tensor forward(const torch::Tensor& x, int micro = 0) const;
  // The backward of a forward's output `y`: y.backward(grad), or y.backward() when `grad` is
  // undefined (y is the loss, on the last chunk). Traced as forward() is, with kind=B.
  void backward(const torch::Tensor& y, const torch::Tensor& grad, int micro = 0) const;
  std::vector<torch::Tensor> parameters() const;
};

// This rank's chunks (stage `stage` of `pp`, `v` chunks each), in pipeline order; the weights of
// every other unit are released (emptied) in `model`, which must outlive the chunks. Throws
// std::invalid_argument, one line naming the caller's line, when the model has fewer blocks than
// chunks or stage is not in 0..pp-1.
std::vector<Chunk> take_chunks(TransformerLM& model, int pp, int v, int stage, CallSite site = {});

}  // namespace kit::pp
