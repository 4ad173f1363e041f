// kit/data/data_loader.cpp — DistributedSampler (see data_loader.h).
#include "kit/data/data_loader.h"

#include <random>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "kit/runtime/distributed.h"

namespace kit {

DistributedSampler::DistributedSampler(size_t dataset_size, bool shuffle, uint64_t seed,
                                       int num_replicas, int rank)
    : dataset_size_(dataset_size), shuffle_(shuffle), seed_(seed),
      replicas_(num_replicas > 0 ? num_replicas : get_world_size()),
      rank_(rank >= 0 ? rank : get_rank()) {
  // Before setup() the defaults would be rank 0 of 1 on every process: each would take the whole
  // dataset, N times the work, and nothing would say so. PyTorch's sampler raises here too.
  TORCH_CHECK(is_initialized() || (num_replicas > 0 && rank >= 0),
              "DistributedSampler: made before kit::setup(), so every rank would take the whole "
              "dataset: call setup() first, or pass num_replicas and rank");
  TORCH_CHECK(dataset_size_ > 0, "DistributedSampler: the dataset is empty");
  TORCH_CHECK(rank_ < replicas_, "DistributedSampler: rank ", rank_, " >= num_replicas ", replicas_);
  observe::sampler(dataset_size_, replicas_, rank_, shuffle_, seed_);
}

std::vector<size_t> DistributedSampler::indices() const {
  std::vector<size_t> all(dataset_size_);
  std::iota(all.begin(), all.end(), size_t{0});
  if (shuffle_) {
    // Fisher-Yates with a standard-defined engine: the same order on every rank, compiler and
    // machine, because every rank must cut the same list.
    std::mt19937_64 engine(seed_ + static_cast<uint64_t>(epoch_));
    for (size_t i = all.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(engine() % i);
      std::swap(all[i - 1], all[j]);
    }
  }
  // Without padding (DistributedEvalSampler) the slices simply stop at the end of the split.
  size_t total = pad_ ? size() * static_cast<size_t>(replicas_) : dataset_size_;
  for (size_t k = 0; all.size() < total; ++k) all.push_back(all[k]);
  std::vector<size_t> mine;
  for (size_t k = static_cast<size_t>(rank_); k < total; k += static_cast<size_t>(replicas_))
    mine.push_back(all[k]);
  return mine;
}

std::vector<size_t> random_order(size_t n) {
  auto perm = torch::randperm(static_cast<int64_t>(n), torch::kLong);
  std::vector<size_t> order(n);
  auto* p = perm.data_ptr<int64_t>();
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<size_t>(p[i]);
  return order;
}

bool can_pin_memory() {
  static const bool cuda = torch::cuda::is_available();
  return cuda;
}

}  // namespace kit
