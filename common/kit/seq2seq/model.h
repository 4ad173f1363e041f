// kit/seq2seq/model.h — Seq2Seq: the news summariser's encoder-decoder Transformer. The layers are
// LibTorch's own torch::nn::Transformer (post-norm, ReLU, final LayerNorms on the encoder and the
// decoder: torch.nn.Transformer's defaults), so PyTorch's module, given the same weights, computes
// the same numbers (oracle.seq2seq_against_torch, tests/oracle/oracle_seq2seq.py).
//
//   kit::Seq2Seq model(kit::Seq2SeqOptions{.vocab_size = 8000, .pad_id = 0, .bos_id = 2, .eos_id = 3});
//   auto logits = model->forward(documents, summary_in);   // teacher forcing: [batch, T, vocab]
//   auto loss = kit::seq2seq_loss(logits, summary_out, model->options().pad_id);
//   auto ids = model->greedy_decode(documents, 64);        // [batch, <= 64]
//   auto best = model->beam_decode(documents, 64, 4);      // the same form, 4 beams
//
// Choices, and why:
//  - one embedding matrix for the encoder's input, the decoder's input and the output projection
//    (logits = h . E^T, no output bias): documents and summaries share the tokenizer, and one
//    matrix stands where three would (Press & Wolf 2017; as "Attention is all you need"). It is
//    drawn from N(0, 1/d_model) and multiplied by sqrt(d_model) at the input: inputs of unit
//    scale, and logits of unit scale at the start (h, after the final LayerNorm, has unit scale);
//  - sinusoidal positions, a buffer as in kit/models/transformer_lm.h: nothing to learn, shard or
//    average, and the same code as the course's language model;
//  - padding: a position holding pad_id is masked as a key everywhere (src_key_padding_mask in
//    the encoder, memory_key_padding_mask in the decoder's cross-attention, tgt_key_padding_mask
//    in its self-attention), so that a real position's output does not depend on how much padding
//    its row got; the decoder also gets the causal mask. A row of only pad_id has no key to
//    attend to and gives NaN, as in PyTorch: every source row needs a token, every target row
//    starts with bos_id.
//
// Weights: those drawn after torch::manual_seed(options.seed) (the kit's rule, kit/parallel/
// parallel_lm.h), on the CPU; the constructor puts torch's CPU generator back as it found it. The parameters
// keep torch's names under "embed." and "transformer." (the oracle loads them by name).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/transformer.h>
#include <torch/nn/pimpl.h>

namespace kit {

struct Seq2SeqOptions {
  int64_t vocab_size = 0;  // the tokenizer's (XsumVocab::size())
  int64_t d_model = 128;
  int64_t heads = 4;  // must divide d_model
  int64_t encoder_layers = 2;
  int64_t decoder_layers = 2;
  int64_t feedforward = 256;
  double dropout = 0.1;
  int64_t max_len = 512;  // the longest source or target sequence (the position table's size)
  // XsumVocab's ids by default (kit/data/xsum.h).
  int64_t pad_id = 0;
  int64_t bos_id = 2;
  int64_t eos_id = 3;
  uint64_t seed = 0;  // the initial weights' (above)
};

// One unit of the model as a chain, for ZeRO-3 (kit/sharding/zero3.h: FullyShardedModel takes a
// list of these): the module whose parameters it reads, what it computes, and whether it is an
// earlier unit's parameters used again (the tied embedding).
struct Seq2SeqUnit {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> run;
  bool reuse = false;
};

class Seq2SeqImpl : public torch::nn::Module {
 public:
  // std::invalid_argument, one line naming "Seq2Seq", for options that cannot make a model.
  explicit Seq2SeqImpl(const Seq2SeqOptions& options);

  // Teacher forcing. src: int64 [batch, S] (documents, padded with pad_id); tgt_in: int64
  // [batch, T] (bos_id then the summary, padded) -> logits [batch, T, vocab]: position t predicts
  // the summary's token t (then eos_id). std::invalid_argument, one line naming
  // "Seq2Seq::forward", for ids that are not int64 [batch, len], batches that differ, a length
  // over max_len.
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& tgt_in);

  // The halves of forward(): the encoder's output [S, batch, d_model] (torch's layout) and the
  // decoder's logits given it. forward(src, tgt) is decode(encode(src), src, tgt).
  torch::Tensor encode(const torch::Tensor& src);
  torch::Tensor decode(const torch::Tensor& memory, const torch::Tensor& src,
                       const torch::Tensor& tgt_in);

  // Greedy decoding, batched, without gradients (the caller chooses train() or eval()): from
  // bos_id, the most likely token at each step, at most max_len tokens. int64 [batch, L <=
  // max_len], bos_id not included; a row stops at its first eos_id (kept) and holds pad_id after
  // it; the loop ends when every row has stopped. std::invalid_argument naming
  // "Seq2Seq::greedy_decode" for max_len < 1 or > options().max_len.
  torch::Tensor greedy_decode(const torch::Tensor& src, int64_t max_len);

  // Beam search, one row at a time (its `beam` hypotheses in one batch), without gradients. From
  // bos_id, each step extends every live hypothesis by every token and keeps the `beam` best by
  // summed log-probability; one that takes eos_id is finished, scored by its summed
  // log-probability over its length (tokens after bos_id, eos_id included) ** length_penalty
  // (1: the mean per token; 0: the sum, which favours short summaries). The search stops once
  // `beam` hypotheses have finished, or at max_len, where the live ones join the finished; the
  // best score wins (the first found on a tie). The same form as greedy_decode's result, and
  // beam 1 is greedy_decode. std::invalid_argument naming "Seq2Seq::beam_decode" for beam < 1
  // and for what greedy_decode refuses.
  torch::Tensor beam_decode(const torch::Tensor& src, int64_t max_len, int64_t beam,
                            double length_penalty = 1.0);

  // The model as a chain of units, in the order forward() runs them, for ZeRO-3: the embedding
  // (the documents), each encoder layer, the encoder's norm, the embedding again (the summary
  // inputs: its output is the encoder's memory with the summary's embedding after it along the
  // length), each decoder layer (the memory passes through, so that its gradient flows back along
  // the chain), the decoder's norm, and the embedding a third time (the output projection). The
  // chain's input is the documents; forward_chain() gives the units the batch's summary inputs
  // and masks and runs a chain:
  //   kit::FullyShardedModel sharded(model, model->units(), kit::ZeroOptions{.stage = 3, ...});
  //   auto logits = model->forward_chain(
  //       [&](const torch::Tensor& x) { return sharded.forward(x); }, src, tgt_in);
  // The same numbers as forward(src, tgt_in), dropout's draws included (the same ones, in the
  // same order). The units read the batch of the last forward_chain() (a recomputing
  // FullyShardedModel runs them again in backward, before the next).
  std::vector<Seq2SeqUnit> units();
  using Chain = std::function<torch::Tensor(const torch::Tensor&)>;
  torch::Tensor forward_chain(const Chain& chain, const torch::Tensor& src,
                              const torch::Tensor& tgt_in);

  const Seq2SeqOptions& options() const { return options_; }
  // Module::to, told to the checker first (kit/check/observe.h), as TransformerLM's.
  void to(torch::Device device, bool non_blocking = false) override;
  using torch::nn::Module::to;
  torch::nn::Embedding& embedding() { return embed_; }
  torch::nn::Transformer& transformer() { return transformer_; }

 private:
  torch::Tensor embed(const torch::Tensor& ids);  // [batch, len] -> [len, batch, d_model]
  // decode()'s piece that units() runs too: the output projection [T, batch, d] ->
  // [batch, T, vocab].
  torch::Tensor project(const torch::Tensor& h);
  void check_ids(const torch::Tensor& ids, const char* what, const char* call) const;
  // The weights are here (not emptied by ZeRO-3 between uses), or one line naming the call.
  void check_weights(const char* call) const;

  Seq2SeqOptions options_;
  torch::nn::Embedding embed_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Transformer transformer_{nullptr};
  torch::Tensor positions_;  // sinusoidal position codes [max_len, d_model], a buffer
  int64_t training_forwards_ = 0;  // numbers each training forward for the checker's trace
  // What units() read: the batch of the last forward_chain(), its padding and causal masks.
  struct ChainBatch {
    torch::Tensor tgt_in, src_pad, tgt_pad, causal;
    int64_t src_len = 0;
  };
  std::shared_ptr<ChainBatch> chain_ = std::make_shared<ChainBatch>();
};
TORCH_MODULE(Seq2Seq);

// A batch's ids as every Seq2Seq model takes them (Seq2Seq, ParallelSeq2Seq): src and tgt_in
// int64 [batch, length], each length in [1, max_len], as many rows in both; else one line naming
// the call (std::invalid_argument).
void check_seq2seq_pair(const torch::Tensor& src, const torch::Tensor& tgt_in, int64_t max_len,
                        const char* call);
// The decoder's causal mask [len, len]: -inf above the diagonal, so that position t sees the
// targets up to t (float, as Python's Transformer.generate_square_subsequent_mask).
torch::Tensor seq2seq_causal_mask(int64_t len, torch::Device device);

// Mean cross-entropy over the positions whose target is not pad_id (cross_entropy with
// ignore_index = pad_id, PyTorch's mean over the counted positions). logits [b, T, v], targets
// [b, T]. A batch whose every target is pad_id gives NaN (0/0), as PyTorch's does.
torch::Tensor seq2seq_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                           int64_t pad_id);

}  // namespace kit
