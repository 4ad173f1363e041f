// kit/models/weather_vit.cpp — WeatherViT (see weather_vit.h).
#include "kit/models/weather_vit.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include "kit/check/observe.h"  // the checker's records of the model's device and forwards

namespace kit {

namespace {

torch::nn::LayerNorm layer_norm(int64_t n) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({n}).eps(1e-6));
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias = true) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(l->weight, 0.0, 0.02);
  if (bias) torch::nn::init::zeros_(l->bias);
  return l;
}

}  // namespace

ViTBlockImpl::ViTBlockImpl(int64_t embed, int64_t heads, int64_t mlp_ratio) : heads_(heads) {
  norm1_ = register_module("norm1", layer_norm(embed));
  qkv_ = register_module("qkv", linear(embed, 3 * embed));
  proj_ = register_module("proj", linear(embed, embed));
  norm2_ = register_module("norm2", layer_norm(embed));
  fc1_ = register_module("fc1", linear(embed, mlp_ratio * embed));
  fc2_ = register_module("fc2", linear(mlp_ratio * embed, embed));
}

torch::Tensor ViTBlockImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), n = x.size(1), e = x.size(2), d = e / heads_;
  // Queries, keys and values of every head: [3, B, heads, N, d].
  auto qkv = qkv_->forward(norm1_->forward(x)).view({b, n, 3, heads_, d}).permute({2, 0, 3, 1, 4});
  auto q = qkv[0] * (1.0 / std::sqrt(static_cast<double>(d))), k = qkv[1], v = qkv[2];
  auto attention = torch::softmax(torch::matmul(q, k.transpose(-2, -1)), -1);  // [B, heads, N, N]
  auto mixed = torch::matmul(attention, v).transpose(1, 2).reshape({b, n, e});
  auto h = x + proj_->forward(mixed);
  return h + fc2_->forward(torch::gelu(fc1_->forward(norm2_->forward(h))));
}

WeatherViTImpl::WeatherViTImpl(const WeatherViTOptions& o) : options_(o) {
  const auto p = o.patch;
  if (p < 1 || o.lat % p != 0 || o.lon % p != 0)
    throw std::invalid_argument("WeatherViT: a grid of " + std::to_string(o.lat) + " x " +
                                std::to_string(o.lon) + " is not made of whole " +
                                std::to_string(p) + " x " + std::to_string(p) +
                                " patches (--patch-size must divide lat and lon)");
  if (o.heads < 1 || o.embed % o.heads != 0)
    throw std::invalid_argument("WeatherViT: " + std::to_string(o.heads) +
                                " heads do not divide the embedding of " + std::to_string(o.embed) +
                                " (--heads must divide --embed-dim)");
  embed_ = register_module(
      "patch_embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(o.channels, o.embed, p).stride(p)));
  const int64_t tokens = (o.lat / p) * (o.lon / p);
  position_ = register_parameter("position", torch::randn({1, tokens, o.embed}) * 0.02);
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) blocks_->push_back(ViTBlock(o.embed, o.heads, o.mlp_ratio));
  norm_ = register_module("norm", layer_norm(o.embed));
  head_ = register_module("head", linear(o.embed, o.channels * p * p, /*bias=*/false));
}

torch::Tensor WeatherViTImpl::forward(const torch::Tensor& fields) {
  if (is_training()) {
    observe::training_forward(*this, ++training_forwards_);
  } else if (!evaluating_) {
    observe::evaluation(*this);
  }
  evaluating_ = !is_training();
  const auto& o = options_;
  const int64_t b = fields.size(0), p = o.patch, h = o.lat / p, w = o.lon / p;
  // [B, embed, h, w] -> one token per patch, row by row: [B, h * w, embed].
  auto x = embed_->forward(fields).flatten(2).transpose(1, 2) + position_;
  for (const auto& block : *blocks_) x = block->as<ViTBlock>()->forward(x);
  // Each token back to its patch: [B, h, w, C, p, p] -> [B, C, h, p, w, p] -> the grid.
  auto out = head_->forward(norm_->forward(x))
                 .view({b, h, w, o.channels, p, p})
                 .permute({0, 3, 1, 4, 2, 5})
                 .reshape({b, o.channels, o.lat, o.lon});
  observe::forward_precision(is_training() ? training_forwards_ : 0, out.scalar_type());
  return out;
}

void WeatherViTImpl::to(torch::Device device, bool non_blocking) {
  observe::model_to(device);
  torch::nn::Module::to(device, non_blocking);
}

}  // namespace kit
