// kit/models/transformer_lm.cpp — the language model (see transformer_lm.h).
#include "kit/models/transformer_lm.h"

#include <cmath>
#include <limits>
#include <variant>

#include <torch/torch.h>

#include "kit/check/observe.h"  // model_to(), training_forward(), evaluation(): for the checker

namespace kit {
namespace {

// One post-norm ReLU encoder layer: what TransformerEncoderLayerImpl::forward computes, op for op
// (the same numbers, the same random numbers drawn in the same order), without two costs of the
// C++ frontend that Python's layer does not pay:
//  - the frontend's layer asks its attention for the weights averaged over the heads and throws
//    them away: one more pass over [batch x heads, seq, seq] per layer, every step;
//  - the frontend's attention compares query, key and value element by element (torch::equal) to
//    find out that this is self-attention; here that is known.
torch::Tensor encoder_layer(torch::nn::TransformerEncoderLayerImpl& layer, const torch::Tensor& x,
                            const torch::Tensor& causal) {
  namespace F = torch::nn::functional;
  TORCH_CHECK(std::holds_alternative<torch::enumtype::kReLU>(layer.options.activation()),
              "TransformerLM: the encoder layers use ReLU");
  auto& attn = *layer.self_attn;
  const int64_t seq = x.size(0), batch = x.size(1), d = x.size(2);
  const int64_t heads = attn.options.num_heads(), head_dim = d / heads;
  // [seq, batch, d] -> [batch x heads, seq, head_dim]
  auto per_head = [&](const torch::Tensor& t) {
    return t.contiguous().view({seq, batch * heads, head_dim}).transpose(0, 1);
  };
  // The key third of the bias held at zero (transformer_lm.h): this layer's bias with zeros in
  // its place, so that its gradient is exactly zero. The query and value thirds are the same
  // numbers, and so is their gradient.
  const auto& b = attn.in_proj_bias;
  auto bias = torch::cat({b.narrow(0, 0, d), torch::zeros({d}, b.options()), b.narrow(0, 2 * d, d)});
  auto qkv = F::linear(x, attn.in_proj_weight, bias).chunk(3, /*dim=*/-1);
  auto q = qkv[0] * (1 / std::sqrt(head_dim));
  auto scores = torch::bmm(per_head(q), per_head(qkv[1]).transpose(1, 2));
  scores += causal.unsqueeze(0);
  auto weights = F::dropout(F::softmax(scores, /*dim=*/-1),
                            F::DropoutFuncOptions().p(attn.options.dropout()).training(attn.is_training()));
  auto mixed = torch::bmm(weights, per_head(qkv[2])).transpose(0, 1).contiguous().view({seq, batch, d});
  auto attended = F::linear(mixed, attn.out_proj->weight, attn.out_proj->bias);
  auto h = layer.norm1(x + layer.dropout1(attended));
  return layer.norm2(h + layer.dropout2(layer.linear2(layer.dropout(F::relu(layer.linear1(h))))));
}

}  // namespace

torch::Tensor key_bias(torch::nn::TransformerEncoderLayerImpl& layer) {
  const int64_t d = layer.self_attn->options.embed_dim();
  return layer.self_attn->in_proj_bias.narrow(0, d, d);
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
  // The encoder keeps the layer it cloned its layers from in its options: one more layer of
  // weights that nothing reads or trains (Python's nn.TransformerEncoder keeps only the clones).
  // Dropped, so that the model holds its parameters and buffers and nothing else (the peaks of
  // kit/train/memory.h count every byte).
  encoder_->options.encoder_layer(nullptr);
  head_ = register_module("head", torch::nn::Linear(o.d_model, o.vocab_size));
  // The attention's key bias starts at zero (torch's MultiheadAttention already sets all of
  // in_proj_bias to zero; said here because encoder_layer() relies on it) and stays there: see
  // the header.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < encoder_->layers->size(); ++i)
      key_bias(*encoder_->layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i)).zero_();
  }

  // Sinusoidal position codes: a buffer, not a parameter, so nothing to learn or to average.
  positions_ = register_buffer("positions", sinusoidal_positions(o.max_len, o.d_model));
}

torch::Tensor sinusoidal_positions(int64_t max_len, int64_t d_model) {
  auto pos = torch::arange(max_len, torch::kFloat).unsqueeze(1);
  auto freq = torch::exp(torch::arange(0, d_model, 2, torch::kFloat) *
                         (-std::log(10000.0) / static_cast<double>(d_model)));
  auto pe = torch::zeros({max_len, d_model});
  using torch::indexing::None;
  using torch::indexing::Slice;
  pe.index_put_({Slice(), Slice(0, None, 2)}, torch::sin(pos * freq));
  pe.index_put_({Slice(), Slice(1, None, 2)}, torch::cos(pos * freq));
  return pe;
}

void TransformerLMImpl::to(torch::Device device, bool non_blocking) {
  observe::model_to(device);
  torch::nn::Module::to(device, non_blocking);
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens) {
  if (is_training()) observe::training_forward(*this, ++training_forwards_);
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
  // The encoder's layers one by one, as TransformerEncoder::forward runs them (no final norm),
  // each through encoder_layer() above rather than the layer's own forward().
  TORCH_CHECK(encoder_->norm.is_empty(), "TransformerLM::units: the encoder has a final norm");
  for (size_t i = 0; i < encoder_->layers->size(); ++i) {
    auto layer = encoder_->layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i);
    out.push_back({layer, [layer](const torch::Tensor& x) {
      const int64_t seq = x.size(0);
      auto causal = torch::triu(
          torch::full({seq, seq}, -std::numeric_limits<float>::infinity(), x.options()), 1);
      return encoder_layer(*layer, x, causal);
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
