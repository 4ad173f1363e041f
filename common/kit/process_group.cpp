// kit/process_group.cpp — ProcessGroup on top of c10d (see process_group.h).
#include "kit/process_group.h"

#include <thread>

#include "kit/compat.h"

namespace kit {

struct Work::Impl {
  compat::WorkPtr work;
  std::vector<torch::Tensor> tensors;
  torch::Tensor flat;    // defined: `tensors` travel packed in this one buffer (see all_reduce_async)
  double divide_by = 0;  // > 0: this was an AVG done as SUM
};

struct ProcessGroup::Impl {
  compat::BackendPtr backend;
  c10::intrusive_ptr<c10d::Store> store;  // kept alive as long as the group
};

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return c10d::ReduceOp::SUM;
    case ReduceOp::AVG: return c10d::ReduceOp::AVG;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// c10d errors are long, multi-line and full of source paths; keep the first line.
std::string first_line(const std::string& what) {
  auto end = what.find('\n');
  return what.substr(0, end);
}

}  // namespace

void Work::wait() {
  try {
    impl_->work->wait();
  } catch (const std::exception& e) {
    throw CommError("collective failed (a rank died or timed out?): " + first_line(e.what()));
  }
  if (impl_->flat.defined()) {
    if (impl_->divide_by > 0) impl_->flat.div_(impl_->divide_by);
    int64_t at = 0;
    for (auto& t : impl_->tensors) {
      t.copy_(impl_->flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  } else if (impl_->divide_by > 0) {
    for (auto& t : impl_->tensors) t.div_(impl_->divide_by);
  }
}

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl, int rank, int size, std::string backend)
    : impl_(std::move(impl)), rank_(rank), size_(size), backend_(std::move(backend)) {}

ProcessGroup::~ProcessGroup() = default;

Work ProcessGroup::all_reduce_async(std::vector<torch::Tensor> tensors, ReduceOp op) {
  auto w = std::make_shared<Work::Impl>();
  bool emulate_avg = op == ReduceOp::AVG && backend_ == "gloo" && !compat::kGlooHasAvg;
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(emulate_avg ? ReduceOp::SUM : op);
  // c10d reads a list of tensors as "one tensor per local GPU": they must all have one shape,
  // and it reduces over the list too ({a, b} would come back as a + b in both). Several tensors
  // therefore travel packed in one flat buffer, unpacked in wait().
  std::vector<torch::Tensor> send = tensors;
  if (tensors.size() > 1) {
    std::vector<torch::Tensor> parts;
    for (auto& t : tensors) {
      if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device())
        throw CommError("all_reduce: the tensors of one call must share one dtype and device");
      parts.push_back(t.detach().reshape(-1));
    }
    w->flat = torch::cat(parts);
    send = {w->flat};
  }
  try {
    w->work = impl_->backend->allreduce(send, opts);
  } catch (const std::exception& e) {
    throw CommError("all_reduce failed: " + first_line(e.what()));
  }
  w->tensors = std::move(tensors);
  w->divide_by = emulate_avg ? size_ : 0;
  return Work(w);
}

void ProcessGroup::broadcast(torch::Tensor tensor, int root) {
  std::vector<torch::Tensor> ts{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  auto w = std::make_shared<Work::Impl>();
  try {
    w->work = impl_->backend->broadcast(ts, opts);
  } catch (const std::exception& e) {
    throw CommError("broadcast failed: " + first_line(e.what()));
  }
  Work(w).wait();
}

void ProcessGroup::barrier() {
  auto w = std::make_shared<Work::Impl>();
  try {
    w->work = impl_->backend->barrier();
  } catch (const std::exception& e) {
    throw CommError("barrier failed: " + first_line(e.what()));
  }
  Work(w).wait();
}

std::vector<std::shared_ptr<ProcessGroup>> ProcessGroup::local_groups(
    int n, std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(n);
  std::vector<std::thread> threads;
  // Creating a Gloo group is itself collective (every rank connects to every other), so the
  // n constructors must run at the same time.
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto impl = std::make_shared<Impl>();
      impl->store = store;
      impl->backend = compat::make_gloo(store, r, n, timeout);
      groups[r] = std::make_shared<ProcessGroup>(impl, r, n, "gloo");
    });
  for (auto& t : threads) t.join();
  return groups;
}

}  // namespace kit

namespace kit {

std::shared_ptr<ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const std::string& backend,
                                                 std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->store = store;
#if defined(KIT_HAVE_NCCL)
  if (backend == "nccl") impl->backend = compat::make_nccl(store, rank, size, timeout);
#endif
  if (backend == "gloo") impl->backend = compat::make_gloo(store, rank, size, timeout);
  if (!impl->backend) throw CommError("backend '" + backend + "' is not available in this LibTorch");
  return std::make_shared<ProcessGroup>(impl, rank, size, backend);
}

}  // namespace kit
