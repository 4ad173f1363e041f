// kit/transformer_lm.h — TransformerLM: a small decoder-only Transformer that predicts the next
// word. The model is not the subject of the course; any torch::nn::Module would do.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/transformercoder.h>
#include <torch/nn/pimpl.h>

#include "kit/args.h"

namespace kit {

struct TransformerLMOptions {
  int64_t vocab_size = 0;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t feedforward = 256;
  double dropout = 0.1;
  int64_t max_len = 512;

  // The sizes the trainers' flags ask for (kit/args.h), for a vocabulary of vocab_size words.
  static TransformerLMOptions from(const TrainArgs& args, int64_t vocab_size);
};

class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(const TransformerLMOptions& options);
  // tokens: [batch, seq] word ids -> logits [batch, seq, vocab]. Each position only sees the
  // positions before it (causal mask), so position t predicts word t+1.
  torch::Tensor forward(const torch::Tensor& tokens);

  // The model as a chain of units: forward() is the units applied in order (the embedding, each
  // encoder layer, the output layer). ZeRO-3 (kit/zero3.h) shards the parameters unit by unit
  // and gathers each unit's just for its turn. `module` holds the unit's parameters; `run` is what
  // it computes, from the previous unit's output (the tokens, for the first). Valid as long as
  // the model lives.
  struct Unit {
    std::shared_ptr<torch::nn::Module> module;
    std::function<torch::Tensor(const torch::Tensor&)> run;
  };
  std::vector<Unit> units();
  // As Module::to, and for the checker (trace.h) records the device the trainer asked for
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

// Mean cross-entropy of next-word predictions: logits [b, s, v], targets [b, s].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace kit
