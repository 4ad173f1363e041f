// kit/data/device_batches.h — DeviceBatches: a DataLoader's batches, already on the device, the next
// one on its way while the model computes on the current one.
//
//   for (kit::Batch b : kit::DeviceBatches(train_loader, device)) {
//     auto prediction = model->forward(b.input);   // b is on `device`
//
// When the loop asks for batch k, the loader hands over batch k + 1 and its copy to the device
// starts, on a CUDA stream of its own and non_blocking (from pinned memory: LoaderOptions::
// pin_memory), so that it travels while the GPU computes batch k; batch k is handed over once its
// own copy is done (the current stream waits for it, the host does not). This is the prefetcher of
// NVIDIA's examples that NERSC's course points to. On a CPU there is nothing to copy: the batches
// are the loader's, one ahead, which changes only when the next one is read.
#pragma once

#include <memory>
#include <utility>

#include <torch/types.h>

#include "kit/data/loader_workers.h"  // Batch

namespace kit {

// The copies, one batch ahead (device_batches.cpp; CUDA's streams are kit/compat.h's).
class DeviceCopier {
 public:
  explicit DeviceCopier(torch::Device device);
  ~DeviceCopier();
  void start(const Batch& host);  // the next batch's copy begins
  Batch take();                   // the batch started last, ready for the current stream
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

template <typename Loader>
class DeviceBatches {
 public:
  DeviceBatches(const Loader& loader, torch::Device device) : loader_(&loader), device_(device) {}
  DeviceBatches(const Loader&&, torch::Device) = delete;  // the loader must outlive the loop

  class iterator {
   public:
    using Inner = decltype(std::declval<const Loader&>().begin());
    iterator(Inner at, Inner end, torch::Device device, bool first)
        : at_(std::move(at)), end_(std::move(end)) {
      if (first && at_ != end_) {
        copier_ = std::make_shared<DeviceCopier>(device);
        copier_->start(*at_);  // batch 0 on its way
        ++at_;
        pending_ = true;
      }
    }
    Batch operator*() const {
      Batch current = copier_->take();
      pending_ = false;
      if (at_ != end_) {  // the next batch starts before the model computes this one
        copier_->start(*at_);
        ++at_;
        pending_ = true;
      }
      return current;
    }
    iterator& operator++() { return *this; }  // operator* moved on already
    bool operator!=(const iterator&) const { return pending_; }

   private:
    mutable Inner at_;
    Inner end_;
    std::shared_ptr<DeviceCopier> copier_;
    mutable bool pending_ = false;  // a batch has been started and not yet taken
  };

  iterator begin() const { return iterator(loader_->begin(), loader_->end(), device_, true); }
  iterator end() const { return iterator(loader_->end(), loader_->end(), device_, false); }

 private:
  const Loader* loader_;
  torch::Device device_;
};

}  // namespace kit
