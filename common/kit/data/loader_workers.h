// kit/data/loader_workers.h — LoaderWorkers: background threads that assemble a DataLoader's next
// batches while the model trains on the current one.
//
// The batches are numbered first, first+1, ... count-1 and made by a function of the number
// alone, so any worker may make any batch and the result does not depend on which one did, or
// when: the consumer receives batch k exactly as it would have made it itself. At most
// workers * prefetch batches are made ahead of the one being consumed, which bounds the memory.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/types.h>

namespace kit {

// One batch: inputs and targets stacked along a new first dimension.
struct Batch {
  torch::Tensor input, target;
};

// Which worker thread of a LoaderWorkers this is: 1..N on the threads of one with N workers, 0 on
// any other thread (the training thread). A dataset may report it, for the checker to see the
// samples read in parallel (kit/data/era5.cpp).
int loader_worker();

class LoaderWorkers {
 public:
  // make(k) builds batch k; it is called from the worker threads, so it must be thread-safe.
  LoaderWorkers(std::function<Batch(size_t)> make, size_t first, size_t count, int64_t workers,
                int64_t prefetch);
  // Stops the workers and waits for them (a loop left early, e.g. by --max-steps).
  ~LoaderWorkers();
  LoaderWorkers(const LoaderWorkers&) = delete;
  LoaderWorkers& operator=(const LoaderWorkers&) = delete;

  // Batch k, waiting until a worker has made it. An exception thrown by make(k) is rethrown here,
  // in the training thread, where the program reports it.
  Batch get(size_t k);
  // The consumer is done with every batch up to k: frees them and lets the workers run ahead.
  void done(size_t k);

 private:
  void work();

  std::function<Batch(size_t)> make_;
  size_t count_, window_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t next_;      // the next batch a worker will take
  size_t consumed_;  // every batch below this one is done
  std::map<size_t, Batch> ready_;
  std::map<size_t, std::exception_ptr> failed_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kit
