// kit/data/data_loader.h — DistributedSampler and DataLoader: which samples a rank reads, in
// batches.
//
// A DataLoader on its own reads the whole dataset (shuffled or in order), as on one GPU. Given a
// DistributedSampler it reads only this rank's share: every rank gets a different, equally long
// slice, and together the ranks cover the dataset once per epoch (DistributedEvalSampler: each
// sample exactly once, for evaluation). With LoaderOptions{.workers =
// N}, N background threads assemble the next batches while the model trains on the current one;
// the batches and their order stay exactly those of workers = 0. With .pin_memory = true each
// batch is in page-locked memory, ready for batch.input.to(device, /*non_blocking=*/true).
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/types.h>

#include "kit/data/loader_workers.h"  // LoaderWorkers (the background threads) and Batch
#include "kit/check/observe.h"  // the checker's records of samplers and batches

namespace kit {

class DistributedSampler {
 public:
  // shuffle: a new order every epoch (see set_epoch). seed: must be the same on every rank,
  // because all ranks shuffle the same list and then each takes its own slice of it.
  // num_replicas / rank default to the process group of kit::setup(); made before setup() without
  // them, it is an error (every rank would take the whole dataset).
  DistributedSampler(size_t dataset_size, bool shuffle = true, uint64_t seed = 0,
                     int num_replicas = -1, int rank = -1);
  template <typename Dataset>
  explicit DistributedSampler(const Dataset& dataset, bool shuffle = true, uint64_t seed = 0)
      : DistributedSampler(dataset.size(), shuffle, seed) {}

  // The shuffle depends on seed + epoch: without this call, every epoch repeats the same order.
  void set_epoch(int64_t epoch) {
    epoch_ = epoch;
    // The size tells the checker which sampler was told the epoch (train, or another one).
    observe::set_epoch(epoch, dataset_size_);
  }

  // This rank's sample indices for the current epoch. The list is padded (by repeating its
  // start) to a multiple of the number of ranks, so every rank does the same number of steps;
  // rank r takes every num_replicas-th index starting at r. (DistributedEvalSampler: no padding.)
  // Padding and cut are PyTorch's DistributedSampler's; the shuffle is not: PyTorch draws
  // torch.randperm from a generator seeded with seed + epoch, the kit runs Fisher-Yates (i from
  // n-1 down to 1, j = e() mod (i + 1), swap i and j) with e = std::mt19937_64(seed + epoch), an
  // engine the C++ standard defines bit for bit, so that every rank, compiler and LibTorch
  // version cuts the same list. tests/oracle/oracle_kit.py checks both against references.
  std::vector<size_t> indices() const;
  size_t size() const {
    const size_t r = static_cast<size_t>(replicas_);
    return pad_ ? (dataset_size_ + r - 1) / r
                : dataset_size_ / r + (static_cast<size_t>(rank_) < dataset_size_ % r ? 1 : 0);
  }
  int num_replicas() const { return replicas_; }
  int rank() const { return rank_; }

 protected:
  bool pad_ = true;

 private:
  size_t dataset_size_;
  bool shuffle_;
  uint64_t seed_;
  int replicas_, rank_;
  int64_t epoch_ = 0;
};

// The sampler of a validation or test split: the same slices as DistributedSampler without its
// padding, in order. The padding repeats samples, so a loss averaged over a padded split depends
// on the number of ranks; here every sample is read exactly once, and rank r's slice may be one
// sample shorter than rank 0's. So the ranks may run different numbers of batches: evaluate with
// per-rank sums and counts, and reduce them (ReduceOp::SUM) once, after the loop.
class DistributedEvalSampler : public DistributedSampler {
 public:
  explicit DistributedEvalSampler(size_t dataset_size, int num_replicas = -1, int rank = -1)
      : DistributedSampler(dataset_size, /*shuffle=*/false, /*seed=*/0, num_replicas, rank) {
    pad_ = false;
  }
  template <typename Dataset>
  explicit DistributedEvalSampler(const Dataset& dataset)
      : DistributedEvalSampler(dataset.size()) {}
};

// How a DataLoader assembles its batches. workers = 0: in the training thread, when the loop
// asks for the next batch. workers = N > 0: N threads make up to N * prefetch batches ahead, so
// that reading and augmenting images overlaps the forward and backward passes.
struct LoaderOptions {
  int64_t workers = 0;   // int64_t like the flags (kit/train/args.h), so {.workers = args.workers} works
  int64_t prefetch = 2;  // batches made ahead per worker
  // PyTorch's DataLoader(pin_memory=True): each batch is copied into page-locked ("pinned") host
  // memory as it is made (by the worker that made it, when there are workers; PyTorch pins in a
  // thread of its own). A copy from pinned memory to the GPU with non_blocking = true is a DMA
  // that the host does not wait for, queued behind the GPU's work; from ordinary (pageable)
  // memory the host waits for the copy. Only when CUDA is available: on a machine without (CPU
  // CI, fakegpu's KIT_DEVICE_CHECK=nccl there too) it does nothing, the batches are as without.
  bool pin_memory = false;
};

// A random permutation of 0..n-1 from torch's generator (seeded by setup() or manual_seed).
std::vector<size_t> random_order(size_t n);

// Whether pinning can be done here: CUDA is available (asked once).
bool can_pin_memory();

// Dataset: anything with size() and get(i) -> {input, target} (and, for the trace, name()).
template <typename Dataset>
class DataLoader {
 public:
  // The whole dataset, in order or shuffled (a fresh order on every pass).
  DataLoader(const Dataset& dataset, size_t batch_size, bool shuffle = false,
             LoaderOptions options = {})
      : data_(&dataset), batch_size_(batch_size), shuffle_(shuffle), options_(checked(options)) {}
  DataLoader(const Dataset& dataset, size_t batch_size, LoaderOptions options)
      : DataLoader(dataset, batch_size, false, options) {}
  // Only the sampler's indices: this rank's share.
  DataLoader(const Dataset& dataset, size_t batch_size, const DistributedSampler& sampler,
             LoaderOptions options = {})
      : data_(&dataset), batch_size_(batch_size), sampler_(&sampler), options_(checked(options)) {}
  // The loader reads the dataset and the sampler it is given where they are, for as long as it
  // lives: a temporary would be gone before the first batch. Refused when it compiles, instead
  // of reading freed memory later (tests/data: DataLoaderTakesNoTemporaries).
  DataLoader(const Dataset&&, size_t, bool = false, LoaderOptions = {}) = delete;
  DataLoader(const Dataset&&, size_t, LoaderOptions) = delete;
  DataLoader(const Dataset&&, size_t, const DistributedSampler&, LoaderOptions = {}) = delete;
  DataLoader(const Dataset&, size_t, const DistributedSampler&&, LoaderOptions = {}) = delete;

  size_t size() const {  // batches per epoch
    size_t n = sampler_ ? sampler_->size() : data_->size();
    return (n + batch_size_ - 1) / batch_size_;
  }

  class iterator {
   public:
    iterator(const DataLoader* loader, std::vector<size_t> order, size_t at)
        : loader_(loader), order_(std::make_shared<std::vector<size_t>>(std::move(order))),
          at_(at) {}
    Batch operator*() const {
      const size_t k = at_ / loader_->batch_size_;
      // The trace is written here, in the training thread, in training order, whoever made it.
      observe::batch(*loader_->data_, *order_, at_, loader_->batch_size_);
      if (loader_->options_.workers == 0) return loader_->collate(*order_, at_);
      // The workers start at the first batch actually used (from() skips batches cheaply).
      if (!workers_) {
        const DataLoader* loader = loader_;
        std::shared_ptr<const std::vector<size_t>> order = order_;
        workers_ = std::make_shared<LoaderWorkers>(
            [loader, order](size_t b) { return loader->collate(*order, b * loader->batch_size_); },
            k, (order_->size() + loader_->batch_size_ - 1) / loader_->batch_size_,
            loader_->options_.workers, loader_->options_.prefetch);
      }
      return workers_->get(k);
    }
    iterator& operator++() {
      if (workers_) workers_->done(at_ / loader_->batch_size_);
      at_ += loader_->batch_size_;
      return *this;
    }
    bool operator!=(const iterator& other) const { return at_ < other.at_; }
   private:
    const DataLoader* loader_;
    std::shared_ptr<const std::vector<size_t>> order_;
    size_t at_;
    mutable std::shared_ptr<LoaderWorkers> workers_;  // made on first use; joined when released
  };

  iterator begin() const {
    std::vector<size_t> order;
    if (sampler_) {
      order = sampler_->indices();
    } else if (shuffle_) {
      order = random_order(data_->size());
    } else {
      order.resize(data_->size());
      std::iota(order.begin(), order.end(), size_t{0});
    }
    return iterator(this, std::move(order), 0);
  }
  // The same pass, starting at batch `first` (a resumed run skips what it already trained on).
  struct Range {
    iterator b, e;
    iterator begin() const { return b; }
    iterator end() const { return e; }
  };
  Range from(size_t first) const {
    iterator it = begin();
    for (size_t k = 0; k < first; ++k) ++it;
    return {it, end()};
  }
  iterator end() const {
    size_t n = sampler_ ? sampler_->size() : data_->size();
    return iterator(this, {}, n);
  }

 private:
  static LoaderOptions checked(LoaderOptions options) {
    if (options.workers < 0)
      throw std::invalid_argument("DataLoader: --workers must be 0 or more, got " +
                                  std::to_string(options.workers));
    if (options.prefetch < 1)
      throw std::invalid_argument("DataLoader: prefetch must be 1 or more, got " +
                                  std::to_string(options.prefetch));
    return options;
  }
  // The batch that starts at position `at` of `order`. Const and free of side effects, so that
  // the workers may call it for different batches at the same time.
  Batch collate(const std::vector<size_t>& order, size_t at) const {
    size_t stop = std::min(order.size(), at + batch_size_);
    std::vector<torch::Tensor> inputs, targets;
    for (size_t k = at; k < stop; ++k) {
      auto [x, y] = data_->get(order[k]);
      inputs.push_back(x);
      targets.push_back(y);
    }
    Batch batch{torch::stack(inputs), torch::stack(targets)};
    if (options_.pin_memory && can_pin_memory()) {
      batch.input = batch.input.pin_memory();
      batch.target = batch.target.pin_memory();
    }
    return batch;
  }

  const Dataset* data_;
  size_t batch_size_;
  bool shuffle_ = false;
  const DistributedSampler* sampler_ = nullptr;
  LoaderOptions options_;
};

}  // namespace kit
