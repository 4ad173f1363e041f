// kit/parallel/random.h — RandomStreams: dropout's two sources of random numbers under tensor
// parallelism, and dropout() drawing from a given one (Megatron's CudaRNGStatesTracker and its
// fork(), with two generators instead of swapping the default one's state).
//
// Why two. A tensor-parallel model has replicated regions (the residual stream: every tp rank holds
// the whole activation, and must hold the same values) and parallel regions (each rank's heads, its
// slice of the MLP). Dropout in a replicated region must drop the same elements on every tp rank,
// or the ranks' copies part: the next row-parallel linear would add up slices of different
// activations, and the replicated weights (norms, embedding) would get different gradients on
// different tp ranks and drift apart, silently. Dropout in a parallel region must drop independent
// elements on each rank: with one stream, each rank's first head (heads 0 and H/tp of the model)
// would lose the same positions at every step, a correlation that the tp = 1 model does not
// have. So:
//   replicated()  seeded alike on the ranks of one tp group: seed + 1 + the rank's index in its
//                 dp x cp group (other data, other positions: other masks);
//   parallel()    seeded differently on every rank: seed + 2718 + the world rank (Megatron's
//                 offset for its model-parallel stream; Megatron adds the tp rank, and the world
//                 rank here also gives other dp and cp ranks other masks).
// kit::setup() seeds the default generator with seed + rank, which differs between tp ranks:
// neither stream can be the default one.
//
// dropout() is torch's dropout, with the generator given: the kept elements scaled by 1 / (1 - p)
// (on the CPU the same numbers as torch::dropout drawing from that generator). The mask is drawn on
// the generator's device (CPU or CUDA) and moved to x's (another device, e.g. the fake GPU of
// KIT_DEVICE_CHECK, draws on the CPU).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <torch/types.h>

namespace kit {

class Mesh;

class RandomStreams {
 public:
  // Generators of `device`'s kind (CUDA for a GPU, the CPU's otherwise).
  RandomStreams(uint64_t seed, const Mesh& mesh, torch::Device device = torch::kCPU);
  at::Generator& replicated() { return replicated_; }
  at::Generator& parallel() { return parallel_; }
  // Both generators' states, for a checkpoint that resumes bit for bit, and back.
  std::vector<torch::Tensor> state();
  void set_state(const std::vector<torch::Tensor>& state);

 private:
  at::Generator replicated_, parallel_;
};

torch::Tensor dropout(const torch::Tensor& x, double p, bool training, at::Generator& gen);

}  // namespace kit
