// kit/runtime/process_group_make.cpp — making a ProcessGroup and closing it (see process_group.h):
// over Gloo or NCCL, with its collectives' timeout, for a trainer's process (make_process_group,
// called by setup()) or as n ranks on threads of one process (local_groups, for tests); whether
// NCCL can run here at all; shutdown().
//
// Apart from the collectives because this is where LibTorch builds and GPUs differ (the
// KIT_HAVE_NCCL parts), and it runs once per group, not once per call.
#include "kit/runtime/process_group.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <torch/cuda.h>

#include "kit/compat.h"
#include "kit/runtime/device_check.h"
#include "kit/runtime/process_group_impl.h"

namespace kit {

using detail::first_line;

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl, int rank, int size, std::string backend)
    : impl_(std::move(impl)), rank_(rank), size_(size), backend_(std::move(backend)) {
  const char* debug = std::getenv("KIT_DEBUG_COLLECTIVES");
  impl_->debug = debug && std::strcmp(debug, "1") == 0 && size_ > 1;
  impl_->fake_device = backend_ == "gloo" && device_check::enabled();
}

ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::alive() const { return impl_->alive; }

void ProcessGroup::shutdown() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->alive = false;
  if (impl_->backend) compat::shutdown_backend(*impl_->backend);
  impl_->backend.reset();
}

bool ProcessGroup::nccl_built() { return compat::kHaveNccl; }

std::string ProcessGroup::nccl_unavailable(int ranks) {
  if (!compat::kHaveNccl)
    return "this LibTorch is a CPU build without CUDA/NCCL (configure against a CUDA build of "
           "torch to run on GPUs)";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string mask = visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "";
  if (!torch::cuda::is_available()) return "no GPU visible to this process" + mask;
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (ranks > gpus)
    return "needs " + std::to_string(ranks) + " GPUs (NCCL puts each rank on a GPU of its own), " +
           std::to_string(gpus) + " visible" + mask;
  return "";
}

std::vector<std::shared_ptr<ProcessGroup>> ProcessGroup::local_groups(
    int n, std::chrono::milliseconds timeout, const std::string& backend) {
  if (backend != "gloo" && backend != "nccl")
    throw CommError("local_groups: '" + backend + "' is not a backend: use gloo or nccl");
  if (backend == "nccl") {
    if (std::string why = nccl_unavailable(n); !why.empty())
      throw CommError("local_groups: " + std::to_string(n) + " NCCL ranks cannot run here: " + why);
  }
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  // Creating a Gloo group is itself collective (every rank connects to every other), so the
  // n constructors must run at the same time. NCCL connects later, at each rank's first
  // collective, on the GPU of the tensors it is given.
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto impl = std::make_shared<Impl>();
        impl->store = store;
        impl->timeout = timeout;
#if defined(KIT_HAVE_NCCL)
        if (backend == "nccl") {
          // Created with rank r's GPU current, as in a process of its own: whatever c10d does
          // on the current device while it builds the group happens on cuda:r, not on cuda:0
          // for every rank. (The current device is per thread: the thread that later calls
          // rank r's collectives selects cuda:r itself.)
          compat::set_cuda_device(r);
          compat::nccl_async_error_handling();
          impl->backend = compat::make_nccl(store, r, n, timeout);
        }
#endif
        if (backend == "gloo") impl->backend = compat::make_gloo(store, r, n, timeout);
        groups[r] = std::make_shared<ProcessGroup>(impl, r, n, backend);
      } catch (const std::exception& e) {
        errors[r] = first_line(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty())
      throw CommError("local_groups: rank " + std::to_string(r) + " of " + std::to_string(n) +
                      " could not create its " + backend + " group: " + errors[r]);
  return groups;
}

std::shared_ptr<ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const std::string& backend,
                                                 std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->store = store;
  impl->timeout = timeout;
#if defined(KIT_HAVE_NCCL)
  if (backend == "nccl") {
    compat::nccl_async_error_handling();  // before the group reads it
    impl->backend = compat::make_nccl(store, rank, size, timeout);
  }
#endif
  if (backend == "gloo") impl->backend = compat::make_gloo(store, rank, size, timeout);
  if (!impl->backend) throw CommError("backend '" + backend + "' is not available in this LibTorch");
  return std::make_shared<ProcessGroup>(impl, rank, size, backend);
}

}  // namespace kit
