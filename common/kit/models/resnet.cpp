// kit/models/resnet.cpp — the image classifier (see resnet.h).
#include "kit/models/resnet.h"

#include <torch/torch.h>

#include "kit/check/observe.h"  // model_to(), training_forward(), evaluation(): for the checker

namespace kit {

namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  // No bias: the batch norm right after it has its own shift.
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

ResidualBlockImpl::ResidualBlockImpl(int64_t in, int64_t out, int64_t stride) {
  conv1_ = register_module("conv1", conv(in, out, 3, stride));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(out));
  conv2_ = register_module("conv2", conv(out, out, 3, 1));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(out));
  shortcut_ = register_module("shortcut", torch::nn::Sequential());
  if (stride != 1 || in != out) {
    shortcut_->push_back(conv(in, out, 1, stride));
    shortcut_->push_back(torch::nn::BatchNorm2d(out));
  }
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1_(conv1_(x)));
  y = bn2_(conv2_(y));
  return torch::relu(y + (shortcut_->is_empty() ? x : shortcut_->forward(x)));
}

ResNetImpl::ResNetImpl(const ResNetOptions& o) : options_(o) {
  TORCH_CHECK(o.width > 0 && o.blocks > 0 && o.classes > 1 && o.channels > 0,
              "ResNet: width, blocks, channels > 0 and classes > 1");
  stem_ = register_module("stem", conv(o.channels, o.width, 3, 1));
  stem_bn_ = register_module("stem_bn", torch::nn::BatchNorm2d(o.width));
  stages_ = register_module("stages", torch::nn::Sequential());
  int64_t in = o.width;
  for (int64_t stage = 0; stage < 3; ++stage) {
    const int64_t out = o.width << stage;
    for (int64_t b = 0; b < o.blocks; ++b) {
      // The first block of stages 2 and 3 halves the image and doubles the channels.
      stages_->push_back(ResidualBlock(in, out, stage > 0 && b == 0 ? 2 : 1));
      in = out;
    }
  }
  head_ = register_module("head", torch::nn::Linear(in, o.classes));
}

void ResNetImpl::to(torch::Device device, bool non_blocking) {
  observe::model_to(device);
  torch::nn::Module::to(device, non_blocking);
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& images) {
  if (is_training()) {
    observe::training_forward(*this, ++training_forwards_);
    evaluating_ = false;
  } else if (!evaluating_) {  // the first forward of an evaluation
    observe::evaluation(*this);
    evaluating_ = true;
  }
  auto x = torch::relu(stem_bn_(stem_(images)));
  x = stages_->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);  // one value per channel
  return head_(x);
}

std::vector<torch::Tensor> running_statistics(const torch::nn::Module& model) {
  std::vector<torch::Tensor> stats;
  for (const auto& b : model.buffers())
    if (b.is_floating_point()) stats.push_back(b);
  return stats;
}

}  // namespace kit
