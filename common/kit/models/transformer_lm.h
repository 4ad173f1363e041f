// kit/models/transformer_lm.h — TransformerLM: a small decoder-only Transformer that predicts the
// next word. The model is not the subject of the course; any torch::nn::Module would do.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/transformercoder.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/nn/pimpl.h>

namespace kit {

// The sinusoidal position codes of "Attention is all you need", [max_len, d_model] float32:
// sin at even columns, cos at odd ones. A buffer for every model of the kit that adds positions
// (TransformerLM, ParallelTransformerLM, Seq2Seq): nothing to learn, shard or average.
torch::Tensor sinusoidal_positions(int64_t max_len, int64_t d_model);

struct TransformerLMOptions {
  int64_t vocab_size = 0;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t feedforward = 256;
  double dropout = 0.1;
  int64_t max_len = 512;
  // The trainers' flags make these with kit::lm_options() (kit/train/args.h): the model knows no
  // flags, models/ sits below train/ (common/kit/README.md, the folders' order).
};

// The attention's key bias (the middle third of each layer's in_proj_bias) is held at zero: it
// starts at zero and the forward uses zeros in its place, so its gradient is exactly 0 and AdamW
// never moves it. Why: softmax ignores a constant added to every score of a row, and a key bias
// adds q . b_k to all of them, so its true gradient is zero; computed, it is float32 rounding
// noise (~1e-9) whose sign depends on the order of summation. AdamW divides by sqrt(v) + eps,
// eps = 1e-8, and turns that noise into updates of about +-lr in whatever direction it points,
// so a reduce-scatter (ZeRO) and an all-reduce (DDP), summing in different orders, train
// different weights. Removing the noise at its source keeps AdamW's default eps and makes the
// key bias identical under DDP and every ZeRO stage: the zero comes from forward itself, so it
// holds for ZeRO-3 too, which builds its gradients from the units' run() and never from hooks on
// the parameters. Why not drop the bias (bias_k): the parameter stays where torch puts it, so
// the model keeps torch.nn's parameter layout and count (the checkpoints, the Python oracle's
// nn.TransformerEncoderLayer, the ZeRO formulas), and the function it computes is unchanged.
// The Python oracle (tests/oracle/oracle_ex01.py) does the same with a gradient hook.
class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(const TransformerLMOptions& options);
  // tokens: [batch, seq] word ids -> logits [batch, seq, vocab]. Each position only sees the
  // positions before it (causal mask), so position t predicts word t+1.
  torch::Tensor forward(const torch::Tensor& tokens);

  // The model as a chain of units: forward() is the units applied in order (the embedding, each
  // encoder layer, the output layer). ZeRO-3 (kit/sharding/zero3.h) shards the parameters unit by
  // unit and gathers each unit's just for its turn. `module` holds the unit's parameters; `run` is
  // what it computes, from the previous unit's output (the tokens, for the first). Valid as long as
  // the model lives.
  struct Unit {
    std::shared_ptr<torch::nn::Module> module;
    std::function<torch::Tensor(const torch::Tensor&)> run;
  };
  std::vector<Unit> units();
  // As Module::to, and for the checker (kit/check/observe.h) records the device the trainer asked for
  // ("model_to device=..."): on a CPU-only machine a wrongly numbered device (cpu:1 where setup()
  // gave cpu) leaves no other trace, because CPU tensors always report plain "cpu".
  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;

 private:
  TransformerLMOptions options_;
  torch::nn::Embedding embed_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::TransformerEncoder encoder_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor positions_;  // fixed sinusoidal position codes [max_len, d_model]
  int64_t training_forwards_ = 0;
};
TORCH_MODULE(TransformerLM);

// The key third of `layer`'s attention in_proj_bias (a view: what TransformerLM holds at zero).
torch::Tensor key_bias(torch::nn::TransformerEncoderLayerImpl& layer);

// Mean cross-entropy of next-word predictions: logits [b, s, v], targets [b, s].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace kit
