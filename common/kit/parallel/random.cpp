// kit/parallel/random.cpp — dropout's two streams (see random.h).
#include "kit/parallel/random.h"

#include <mutex>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "kit/parallel/mesh.h"

namespace kit {
namespace {

// A new generator of the kind that draws for `device`, seeded with `seed`.
at::Generator make_generator(torch::Device device, uint64_t seed) {
  at::Generator gen = device.is_cuda() ? at::globalContext().defaultGenerator(device).clone()
                                       : at::detail::createCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
  return gen;
}

}  // namespace

RandomStreams::RandomStreams(uint64_t seed, const Mesh& mesh, torch::Device device)
    : replicated_(make_generator(device, seed + 1 + mesh.dp_cp().rank())),
      parallel_(make_generator(device, seed + 2718 + mesh.rank())) {}

std::vector<torch::Tensor> RandomStreams::state() {
  std::lock_guard<std::mutex> a(replicated_.mutex()), b(parallel_.mutex());
  return {replicated_.get_state(), parallel_.get_state()};
}

void RandomStreams::set_state(const std::vector<torch::Tensor>& state) {
  if (state.size() != 2)
    throw std::invalid_argument("kit::RandomStreams::set_state: wants the 2 states that state() "
                                "returns, not " + std::to_string(state.size()));
  std::lock_guard<std::mutex> a(replicated_.mutex()), b(parallel_.mutex());
  replicated_.set_state(state[0]);
  parallel_.set_state(state[1]);
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training, at::Generator& gen) {
  if (!training || p == 0) return x;
  if (p < 0 || p > 1)
    throw std::invalid_argument("kit::dropout: p = " + std::to_string(p) + " is not in [0, 1]");
  if (p == 1) return x * torch::zeros_like(x);
  // As ATen's dropout on the CPU: a Bernoulli(1 - p) mask, divided by 1 - p, times x.
  // (bernoulli_ takes the generator's lock itself.)
  torch::Tensor mask = torch::empty(x.sizes(), x.options().device(gen.device()).requires_grad(false))
                           .bernoulli_(1 - p, gen);
  mask.div_(1 - p);
  return x * mask.to(x.device());
}

}  // namespace kit
