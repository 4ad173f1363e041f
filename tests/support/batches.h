// tests/support/batches.h — random_batches(): fixed random inputs for the DDP tests whose ranks
// are threads of one process. Draw them once, before any rank thread starts: torch's random
// generator is shared by the threads, so drawing inside them would depend on their timing.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace kit_test {

// `steps` batches of [rows, cols] standard-normal values, the same for the same seed.
inline std::vector<torch::Tensor> random_batches(uint64_t seed, int steps, int64_t rows, int64_t cols) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(torch::randn({rows, cols}));
  return out;
}

}  // namespace kit_test
