// kit/transformer_lm.cpp — the language model (see transformer_lm.h).
#include "kit/transformer_lm.h"

#include <cmath>

#include <torch/torch.h>

#include "kit/model_trace.h"  // record_model_to(), record_training_forward(): for the checker

namespace kit {

TransformerLMOptions TransformerLMOptions::from(const TrainArgs& args, int64_t vocab_size) {
  TransformerLMOptions o;
  o.vocab_size = vocab_size;
  o.d_model = args.d_model;
  o.heads = args.heads;
  o.layers = args.layers;
  o.feedforward = args.feedforward;
  o.dropout = args.dropout;
  o.max_len = args.seq_len;
  return o;
}

TransformerLMImpl::TransformerLMImpl(const TransformerLMOptions& o) : options_(o) {
  TORCH_CHECK(o.vocab_size > 0, "TransformerLM: vocab_size must be set");
  embed_ = register_module("embed", torch::nn::Embedding(o.vocab_size, o.d_model));
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout));
  auto layer = torch::nn::TransformerEncoderLayer(
      torch::nn::TransformerEncoderLayerOptions(o.d_model, o.heads)
          .dim_feedforward(o.feedforward)
          .dropout(o.dropout));
  encoder_ = register_module("encoder",
                             torch::nn::TransformerEncoder(
                                 torch::nn::TransformerEncoderOptions(layer, o.layers)));
  head_ = register_module("head", torch::nn::Linear(o.d_model, o.vocab_size));

  // Sinusoidal position codes: a buffer, not a parameter, so nothing to learn or to average.
  auto pos = torch::arange(o.max_len, torch::kFloat).unsqueeze(1);
  auto freq = torch::exp(torch::arange(0, o.d_model, 2, torch::kFloat) *
                         (-std::log(10000.0) / static_cast<double>(o.d_model)));
  auto pe = torch::zeros({o.max_len, o.d_model});
  pe.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, torch::indexing::None, 2)},
                torch::sin(pos * freq));
  pe.index_put_({torch::indexing::Slice(), torch::indexing::Slice(1, torch::indexing::None, 2)},
                torch::cos(pos * freq));
  positions_ = register_buffer("positions", pe);
}

void TransformerLMImpl::to(torch::Device device, bool non_blocking) {
  trace::record_model_to(device);
  torch::nn::Module::to(device, non_blocking);
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens) {
  if (is_training()) trace::record_training_forward(*this, ++training_forwards_);
  torch::Tensor x = tokens;
  for (auto& unit : units()) x = unit.run(x);
  return x;
}

std::vector<TransformerLMImpl::Unit> TransformerLMImpl::units() {
  std::vector<Unit> out;
  // Tokens [batch, seq] -> [seq, batch, features]: the C++ TransformerEncoder's layout.
  out.push_back({embed_.ptr(), [this](const torch::Tensor& tokens) {
    const int64_t seq = tokens.size(1);
    TORCH_CHECK(seq <= options_.max_len, "TransformerLM: sequence of ", seq, " > max_len ",
                options_.max_len);
    auto x = embed_(tokens) * std::sqrt(static_cast<double>(options_.d_model));
    return dropout_(x + positions_.narrow(0, 0, seq).unsqueeze(0)).transpose(0, 1);
  }});
  // The encoder's layers one by one, as TransformerEncoder::forward runs them (no final norm).
  TORCH_CHECK(encoder_->norm.is_empty(), "TransformerLM::units: the encoder has a final norm");
  for (size_t i = 0; i < encoder_->layers->size(); ++i) {
    auto layer = encoder_->layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i);
    out.push_back({layer, [layer](const torch::Tensor& x) {
      const int64_t seq = x.size(0);
      auto causal = torch::triu(
          torch::full({seq, seq}, -std::numeric_limits<float>::infinity(), x.options()), 1);
      return layer->forward(x, causal);
    }});
  }
  out.push_back({head_.ptr(), [this](const torch::Tensor& x) { return head_(x.transpose(0, 1)); }});
  return out;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape(-1));
}

}  // namespace kit
