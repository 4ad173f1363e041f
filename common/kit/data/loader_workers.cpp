// kit/data/loader_workers.cpp — LoaderWorkers (see loader_workers.h).
#include "kit/data/loader_workers.h"

#include <utility>

namespace kit {

namespace {
thread_local int t_worker = 0;  // set once by each worker thread (work())
}  // namespace

int loader_worker() { return t_worker; }

LoaderWorkers::LoaderWorkers(std::function<Batch(size_t)> make, size_t first, size_t count,
                             int64_t workers, int64_t prefetch)
    : make_(std::move(make)), count_(count),
      window_(static_cast<size_t>(workers) * static_cast<size_t>(prefetch)),
      next_(first), consumed_(first) {
  for (int64_t w = 0; w < workers; ++w)
    threads_.emplace_back([this, w] {
      t_worker = static_cast<int>(w) + 1;
      work();
    });
}

LoaderWorkers::~LoaderWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void LoaderWorkers::work() {
  for (;;) {
    size_t k;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || next_ >= count_ || next_ < consumed_ + window_; });
      if (stop_ || next_ >= count_) return;
      k = next_++;
    }
    Batch batch;
    std::exception_ptr error;
    try {
      batch = make_(k);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error) failed_[k] = error;
      else ready_[k] = std::move(batch);
    }
    changed_.notify_all();
  }
}

Batch LoaderWorkers::get(size_t k) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return ready_.count(k) != 0 || failed_.count(k) != 0; });
  if (auto bad = failed_.find(k); bad != failed_.end()) std::rethrow_exception(bad->second);
  return ready_.at(k);
}

void LoaderWorkers::done(size_t k) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.erase(ready_.begin(), ready_.upper_bound(k));
    if (k + 1 > consumed_) consumed_ = k + 1;
  }
  changed_.notify_all();
}

}  // namespace kit
