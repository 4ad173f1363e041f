// kit/models/weather_vit.h — WeatherViT: a Vision Transformer that maps the atmosphere at one time
// step to the next, the model of NERSC's "Deep Learning at Scale" course (after FourCastNet and
// others: gridded fields in, the same fields out).
//
//   fields [B, C, lat, lon]
//     -> patch embedding: a convolution with kernel = stride = patch, one token per patch of
//        patch x patch points of all C channels, [B, N, embed] (N = lat/patch x lon/patch),
//        plus a learned position embedding (the tokens know where on the globe they are)
//     -> depth Transformer blocks, pre-norm: x + attention(norm(x)), x + mlp(norm(x)); the
//        attention is global (every patch sees every other), the MLP widens to 4 x embed (GELU)
//     -> a final norm and the head: one linear map of each token back to its patch,
//        C x patch x patch values, put back in place on the grid: [B, C, lat, lon]
//
// NERSC's shape, the default here: 20 channels on a 360 x 720 grid, patch 8 (45 x 90 = 4050
// tokens), embed 384, depth 12, 8 heads (about 21.5 M parameters). The flags of exercise 06 scale
// it down for a CPU (kit check: embed 32, depth 2). Dropout is left out (NERSC's is 0).
// Initialisation: weights normal(0, 0.02) (NERSC draws a normal truncated at 2 standard
// deviations; a plain normal is what LibTorch offers, a difference of no consequence here),
// biases 0, layer norms weight 1 bias 0.
#pragma once

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

namespace kit {

struct WeatherViTOptions {
  int64_t channels = 20;  // in and out (the same fields, one step later)
  int64_t lat = 360, lon = 720;
  int64_t patch = 8;
  int64_t embed = 384;
  int64_t depth = 12;
  int64_t heads = 8;
  int64_t mlp_ratio = 4;
};

// One Transformer block: multi-head self-attention and an MLP, each after a layer norm and
// added to its input.
class ViTBlockImpl : public torch::nn::Module {
 public:
  ViTBlockImpl(int64_t embed, int64_t heads, int64_t mlp_ratio);
  torch::Tensor forward(const torch::Tensor& x);  // [B, N, embed] -> [B, N, embed]

 private:
  int64_t heads_;
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(ViTBlock);

class WeatherViTImpl : public torch::nn::Module {
 public:
  // One line (std::invalid_argument) when the grid is not made of whole patches or the heads do
  // not divide embed.
  explicit WeatherViTImpl(const WeatherViTOptions& options);
  torch::Tensor forward(const torch::Tensor& fields);  // [B, C, lat, lon] -> the same shape
  // As Module::to, and records the device asked for, for the checker (kit/check/observe.h).
  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;
  const WeatherViTOptions& options() const { return options_; }

 private:
  WeatherViTOptions options_;
  torch::nn::Conv2d embed_{nullptr};
  torch::Tensor position_;  // [1, N, embed]
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
  int64_t training_forwards_ = 0;
  bool evaluating_ = false;
};
TORCH_MODULE(WeatherViT);

}  // namespace kit
