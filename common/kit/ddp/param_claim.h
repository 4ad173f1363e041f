// kit/ddp/param_claim.h — ParameterClaim: which wrapper (DDP, ZeRO) looks after a model's
// parameters.
//
// DDP averages the gradients in backward hooks; ZeRO reduce-scatters them itself and updates only
// its own shard. Both on one model would average twice, or update weights that another rank owns,
// and train silently wrong. Each wrapper therefore claims its parameters for as long as it lives,
// and a second claim on any of them is one clear error instead.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <torch/types.h>

namespace kit {

class ParameterClaim {
 public:
  // Throws std::invalid_argument (one line, naming both wrappers) if another wrapper holds one of
  // `params` already.
  ParameterClaim(const std::vector<torch::Tensor>& params, std::string owner);
  ~ParameterClaim();  // releases them
  ParameterClaim(const ParameterClaim&) = delete;
  ParameterClaim& operator=(const ParameterClaim&) = delete;

 private:
  std::vector<const void*> keys_;  // the parameters' TensorImpl: the identity autograd uses too
};

}  // namespace kit
