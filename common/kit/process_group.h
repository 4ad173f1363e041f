// kit/process_group.h — ProcessGroup: a communicator (Gloo on CPU, NCCL on GPU) with the four
// collectives the kit needs, and Work, the handle of one that runs in the background.
//
// This is a thin, version-independent face on c10d: kit/compat.h hides the 1.13 / 2.x split.
// Trainers do not touch it directly; setup() makes the default group and the free functions in
// kit/distributed.h use it. Tests build several groups inside one process (local_groups()).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace kit {

enum class ReduceOp { SUM, AVG, MAX, MIN };

// A collective in flight. wait() blocks until it is done and rethrows its error (a dead peer,
// a timeout) as kit::CommError.
class Work {
 public:
  struct Impl;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
 private:
  std::shared_ptr<Impl> impl_;
};

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ProcessGroup {
 public:
  struct Impl;
  ProcessGroup(std::shared_ptr<Impl> impl, int rank, int size, std::string backend);
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend() const { return backend_; }  // "gloo" or "nccl"

  // In-place all-reduce of `tensors` (all of them in one collective). AVG on a backend without
  // it runs SUM and divides afterwards, in wait().
  Work all_reduce_async(std::vector<torch::Tensor> tensors, ReduceOp op);
  void all_reduce(torch::Tensor tensor, ReduceOp op) { all_reduce_async({tensor}, op).wait(); }
  void broadcast(torch::Tensor tensor, int root);
  void barrier();

  // N groups of one in-process world (HashStore + Gloo), one per rank, for thread-based tests.
  static std::vector<std::shared_ptr<ProcessGroup>> local_groups(
      int n, std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  std::shared_ptr<Impl> impl_;
  int rank_, size_;
  std::string backend_;
};

}  // namespace kit
