// kit/models/resnet.h — ResNet: a small residual CNN for 32x32 colour images (CIFAR-10). Like the
// Transformer of exercise 01, the model is not the subject of the course; what matters for
// data parallelism is that it has batch norm, whose running statistics are buffers that every
// rank updates from its own batches (see exercise 02's TODO 13).
//
// Shape: a 3x3 stem convolution to `width` channels, then three stages of `blocks` residual
// blocks each, with width, 2 x width and 4 x width channels (the second and third stage halve
// the image: 32 -> 16 -> 8), global average pooling and one linear layer to the classes. A
// block is conv-BN-ReLU-conv-BN plus its input (through a 1x1 convolution where the shape
// changes), then ReLU.
//
// Sizes: the default (width 8, 1 block: ~20k parameters) trains in seconds on a CPU, for the
// tests and `kit check`. On GPUs, --width 16 --blocks 3 is the ResNet-20 of the original paper
// (0.27 M parameters, ~91% on CIFAR-10 after ~60 epochs); --width 64 --blocks 2 is 2.8 M
// parameters; --preset gpu (width 128, 2 blocks: 11.1 M) is sized in kit/train/image_args.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace kit {

struct ResNetOptions {
  int64_t width = 8;      // channels of the first stage (the later ones: 2x and 4x)
  int64_t blocks = 1;     // residual blocks per stage (3 stages)
  int64_t classes = 10;
  int64_t channels = 3;   // of the input images
};

// One residual block: out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};  // empty where the shape does not change
};
TORCH_MODULE(ResidualBlock);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);
  // images [batch, channels, 32, 32] (any size the three stages can halve twice) -> logits
  // [batch, classes].
  torch::Tensor forward(const torch::Tensor& images);
  // As Module::to, and records the device asked for, for the checker (kit/check/observe.h).
  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override;
  const ResNetOptions& options() const { return options_; }

 private:
  ResNetOptions options_;
  torch::nn::Conv2d stem_{nullptr};
  torch::nn::BatchNorm2d stem_bn_{nullptr};
  torch::nn::Sequential stages_{nullptr};
  torch::nn::Linear head_{nullptr};
  int64_t training_forwards_ = 0;
  bool evaluating_ = false;  // the last forward was in eval mode
};
TORCH_MODULE(ResNet);

// The batch norm layers' running statistics (running_mean, running_var): the buffers that are
// floating point. num_batches_tracked, a count every rank agrees on, is left out.
std::vector<torch::Tensor> running_statistics(const torch::nn::Module& model);

}  // namespace kit
