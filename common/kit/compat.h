// kit/compat.h — the only place that knows LibTorch versions and builds apart. Included by kit's
// .cpp files only; exercises and solutions never see a version or backend difference.
//
// Supported: LibTorch 2.2 to 2.15 (common/cmake/torch.cmake; common/README.md, "Building on a
// cluster", says which release CI compiles or runs). Releases before 2.2 do not compile. The
// differences handled here, each named where it is handled:
//   1. autograd nodes are held by intrusive_ptr since 2.x (std::shared_ptr before): NodePtr.
//   2. the collectives live on c10d::Backend, not on c10d::ProcessGroup (split in 2.0): Backend.
//   3. (none left) 1.13's Gloo had no AVG and no reduce-scatter, and the kit emulated both. In
//      2.x Gloo has both; its reduce-scatter is itself an emulation inside c10d (an all-reduce
//      of the whole buffer, of which each rank keeps its chunk: twice the traffic of NCCL's real
//      one). The kit calls it as it is; CommStats counts the tensors handed over, not the wire.
//   4. a CPU-only build has no ProcessGroupNCCL and no CUDA runtime: KIT_HAVE_NCCL.
//   5. the Gloo headers are not in the pip wheel, nor in most site modules: c10d's header below
//      parses with the kit's declarations of the few Gloo names it mentions
//      (common/gloo-declarations/gloo/kit_declarations.h says why that is safe); only pointers
//      to Gloo types cross into LibTorch. Since 2.14 that header also calls
//      Context::setTimeout() inline, which the declarations cover.
//   6. GPU memory figures and the GPU's PCI address (for NVML) exist only in a CUDA build; a
//      CPU build answers "not known" (-1, "").
//  10-13. one device fast (kit/perf/, kit/data/device_batches.h): autocast's calls, the CPU
//      kernel of the fused AdamW step, a GPU's compute capability, copies on a side stream (at
//      the end of this file).
#pragma once

#include <torch/version.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if defined(KIT_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#include <ATen/autocast_mode.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>

#if TORCH_VERSION_MAJOR < 2
#error "kit: LibTorch 2.x is required (see common/README.md: supported versions)"
#endif

// 8. KIT_DEVICE_CHECK=nccl's fake device (kit/runtime/device_check.cpp) implements c10's Allocator,
// a DeviceGuardImplInterface and ATen's PrivateUse1 hooks, whose virtual functions changed shape
// within 2.x (Allocator::allocate lost its const, copy_data and most of the hooks are newer than
// 2.2). It is written against 2.13 and newer, what CI runs it on; an older LibTorch builds the
// kit without it, and asking for the mode there is one line that says so.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
#define KIT_HAVE_FAKE_DEVICE 1
#else
#define KIT_HAVE_FAKE_DEVICE 0
#endif

// 9. c10::Allocator, which kit/train/memory.cpp's counting allocator derives from: up to 2.2,
// allocate() is const and there is no copy_data(); from 2.3 on (the headers of 2.2.2, 2.3.1 and
// 2.4.1 read), allocate() is not const and copy_data() must be given.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define KIT_ALLOCATE_CONST
#define KIT_ALLOCATOR_HAS_COPY_DATA 1
#else
#define KIT_ALLOCATE_CONST const
#define KIT_ALLOCATOR_HAS_COPY_DATA 0
#endif

namespace kit::compat {

// 1. Whatever smart pointer this LibTorch hands out for a parameter's gradient accumulator.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<torch::Tensor>()));

// 2. The object that runs the collectives.
using Backend = c10d::Backend;
using BackendPtr = c10::intrusive_ptr<Backend>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

inline BackendPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                            std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  // createDefaultDevice() picks the interface that the host name resolves to; loopback when
  // everything runs on one machine, the fast network on a cluster (GLOO_SOCKET_IFNAME overrides).
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  opts->devices.push_back(ifname && *ifname
                              ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                              : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

// 4.
#if defined(KIT_HAVE_NCCL)
constexpr bool kHaveNccl = true;
inline BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                            std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
inline void set_cuda_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }
#else
constexpr bool kHaveNccl = false;
#endif

// 6. The most bytes the caching allocator held for tensors on GPU `index` since the last reset
// (torch.cuda.max_memory_allocated()); -1 in a CPU build.
inline int64_t peak_gpu_bytes([[maybe_unused]] int index) {
#if defined(KIT_HAVE_NCCL)
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
#else
  return -1;
#endif
}
inline void reset_peak_gpu_bytes([[maybe_unused]] int index) {
#if defined(KIT_HAVE_NCCL)
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
#endif
}
// GPU `index`'s PCI address as NVML spells it ("00000000:65:00.0"), which, unlike the index,
// means the same GPU whatever CUDA_VISIBLE_DEVICES says; "" in a CPU build.
inline std::string pci_bus_id([[maybe_unused]] int index) {
#if defined(KIT_HAVE_NCCL)
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  char id[32];
  std::snprintf(id, sizeof id, "%08x:%02x:%02x.0", static_cast<unsigned>(p->pciDomainID),
                static_cast<unsigned>(p->pciBusID), static_cast<unsigned>(p->pciDeviceID));
  return id;
#else
  return "";
#endif
}

// GPU `index`'s product name ("NVIDIA H100 80GB HBM3"); "" in a CPU build.
inline std::string gpu_name([[maybe_unused]] int index) {
#if defined(KIT_HAVE_NCCL)
  return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->name;
#else
  return "";
#endif
}

// 7. The NCCL path's version-dependent calls (and the CUDA parts it needs), each in one helper.
// c10d::Backend::shutdown(): ProcessGroupNCCL finalizes its communicators and stops its watchdog
// (torch.distributed.destroy_process_group() calls it); a no-op on Gloo. LibTorch 2.2 has no
// Backend::shutdown() (the backend's destructor does that work there), so it is called where it
// exists, found by overload resolution rather than a version number.
template <typename B>
auto shutdown_if_there(B& backend, int) -> decltype(backend.shutdown(), void()) {
  backend.shutdown();
}
template <typename B>
void shutdown_if_there(B&, long) {}
inline void shutdown_backend(Backend& backend) { shutdown_if_there(backend, 0); }

// NCCL's asynchronous error handling: a collective that fails or times out ends the process
// (c10d's watchdog aborts it: SIGABRT, which ddprun names) instead of hanging it. 2.13 and 2.14
// read TORCH_NCCL_ASYNC_ERROR_HANDLING (older: NCCL_ASYNC_ERROR_HANDLING) when the group is made;
// 1 = abort the communicators, then the process. A value the user set is kept.
inline void nccl_async_error_handling() {
  if (std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") == nullptr &&
      std::getenv("NCCL_ASYNC_ERROR_HANDLING") == nullptr)
    setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 0);
}

// 10. A batch of sends and receives on NCCL (torch.distributed.batch_isend_irecv): c10d's
// coalescing, Backend::startCoalescing() then the calls then endCoalescing(), whose Work stands
// for all of them (the calls' own Works may be empty). The same two calls from 2.2 to 2.15; Gloo
// does not implement them (PyTorch runs a Gloo batch one call after the other, and so does the
// kit).
inline void start_coalescing(Backend& backend) { backend.startCoalescing(); }
inline WorkPtr end_coalescing(Backend& backend) { return backend.endCoalescing(); }

#if defined(KIT_HAVE_NCCL)
inline c10::Device current_cuda_device() {
  return c10::Device(c10::kCUDA, c10::cuda::current_device());
}
#endif

// The rank's GPU, whose default generator dropout on the GPU draws from: the current CUDA device
// (setup() makes the rank's GPU current before anything runs on it), or -1 in a CPU build or
// without a visible GPU. Only this one is saved in a checkpoint and restored: not every visible
// GPU's, so that a resume that sees the GPUs otherwise (another CUDA_VISIBLE_DEVICES, another
// --gpu-bind) still finds its own.
inline int rank_cuda_index() {
#if defined(KIT_HAVE_NCCL)
  if (c10::cuda::device_count() > 0) return c10::cuda::current_device();
#endif
  return -1;
}
// How many GPUs this process sees (0 in a CPU build).
inline int cuda_device_count() {
#if defined(KIT_HAVE_NCCL)
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}
// The state of GPU `index`'s default generator, as bytes ("" in a CPU build or for -1).
inline std::string cuda_rng_state([[maybe_unused]] int index) {
#if defined(KIT_HAVE_NCCL)
  if (index >= 0) {
    auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto t = gen.get_state();
    return std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
  }
#endif
  return "";
}
// Restores what cuda_rng_state() returned into GPU `index`'s generator: false (nothing changed)
// in a CPU build or for -1.
inline bool set_cuda_rng_state([[maybe_unused]] int index, [[maybe_unused]] const std::string& state) {
#if defined(KIT_HAVE_NCCL)
  if (index < 0) return false;
  auto t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
  std::memcpy(t.data_ptr(), state.data(), state.size());
  auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
  return true;
#else
  return false;
#endif
}

// Time on a GPU: NCCL runs the collectives on a stream of its own, and Work::wait() only makes
// the current stream wait for it, so a host clock around an enqueue or a wait measures nothing.
// record_gpu_event(device) marks "now" on the device's current stream (nullptr in a CPU build);
// gpu_seconds(a, b) is the device time between two marks (it waits until b has happened).
// ATen's CUDAEvent, not c10::Event: the latter only gained synchronize() and elapsedTime() after
// 2.2, the oldest LibTorch the kit supports.
#if defined(KIT_HAVE_NCCL)
using GpuEvent = at::cuda::CUDAEvent;
#else
struct GpuEvent {};  // a CPU build never makes one
#endif
inline std::unique_ptr<GpuEvent> record_gpu_event([[maybe_unused]] const c10::Device& device) {
#if defined(KIT_HAVE_NCCL)
  auto e = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);  // timing on
  e->record(c10::cuda::getCurrentCUDAStream(device.index()));
  return e;
#else
  return nullptr;
#endif
}
// Whether the device has passed mark `e` (asks, never waits); true in a CPU build.
inline bool gpu_event_done([[maybe_unused]] const GpuEvent& e) {
#if defined(KIT_HAVE_NCCL)
  return e.query();
#else
  return true;
#endif
}
inline double gpu_seconds([[maybe_unused]] const GpuEvent& a, [[maybe_unused]] const GpuEvent& b) {
#if defined(KIT_HAVE_NCCL)
  b.synchronize();
  return a.elapsed_time(b) / 1000.0;
#else
  return 0;
#endif
}

// 10. Host synchronisations on a GPU (kit/runtime/device_check.h: count_host_syncs()). CUDA's
// sync debug mode (torch.cuda.set_sync_debug_mode("warn")) makes every synchronising call of
// c10's (stream synchronisation, blocking copies, item()) warn "called a synchronizing CUDA
// operation"; a c10::WarningHandler counts those warnings, and passes any other on to the handler
// it replaced. c10 keeps one handler per thread: it is installed on the calling thread, which also
// sees the warnings of the backward passes it runs (autograd replays them there when backward
// ends). Written against the headers of 2.13 (c10/cuda/CUDAFunctions.h, c10/util/Exception.h);
// ./kit cuda-build compiles it against 2.14.1; run on an H100 with 2.11 (one rank: the counts
// expected, tests/gpu/RESULTS.md). A CPU build has no CUDA and counts none here.
#if defined(KIT_HAVE_NCCL)
struct SyncWarningCounter final : c10::WarningHandler {
  c10::WarningHandler* next = nullptr;
  std::atomic<int64_t> count{0};
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("called a synchronizing CUDA operation") != std::string::npos) ++count;
    else if (next) next->process(warning);
  }
};
// Never destroyed: c10's handler pointer outlives main(), and with the sync debug mode still on,
// CUDA's teardown at exit warns through it. A static counter destroyed before that made
// host_syncs die of SIGSEGV after its last line on an H100 (tests/gpu/run.sh, 2026-11-27).
inline SyncWarningCounter& sync_warning_counter() {
  static auto* counter = new SyncWarningCounter;
  return *counter;
}
inline void count_cuda_syncs() {
  SyncWarningCounter& counter = sync_warning_counter();
  if (c10::WarningUtils::get_warning_handler() != &counter) {
    counter.next = c10::WarningUtils::get_warning_handler();
    c10::WarningUtils::set_warning_handler(&counter);
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
}
inline int64_t cuda_syncs() { return sync_warning_counter().count.load(); }
#else
inline void count_cuda_syncs() {}
inline int64_t cuda_syncs() { return 0; }
#endif

// 11. Autocast's C++ calls take the device type from 2.4 on (at::autocast::
// is_autocast_enabled(at::kCPU), PyTorch's PR 124359); 2.2 and 2.3 have one function per device
// (is_cpu_enabled(), set_autocast_cpu_dtype(), and is_enabled() for CUDA). CPU and CUDA only:
// kit/perf/amp.h refuses the rest.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType t) { return at::autocast::is_autocast_enabled(t); }
inline void set_autocast_enabled(c10::DeviceType t, bool on) { at::autocast::set_autocast_enabled(t, on); }
inline at::ScalarType autocast_dtype(c10::DeviceType t) { return at::autocast::get_autocast_dtype(t); }
inline void set_autocast_dtype(c10::DeviceType t, at::ScalarType d) { at::autocast::set_autocast_dtype(t, d); }
#else
inline bool autocast_enabled(c10::DeviceType t) {
  return t == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType t, bool on) {
  if (t == c10::kCPU) at::autocast::set_cpu_enabled(on);
  else at::autocast::set_enabled(on);
}
inline at::ScalarType autocast_dtype(c10::DeviceType t) {
  return t == c10::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType t, at::ScalarType d) {
  if (t == c10::kCPU) at::autocast::set_autocast_cpu_dtype(d);
  else at::autocast::set_autocast_gpu_dtype(d);
}
#endif

// 12. at::_fused_adamw_ (torch.optim.AdamW(fused=True)) has a CUDA kernel in every supported
// release and a CPU kernel from 2.4 on (PyTorch's PR 123074); before, kit::FusedAdamW refuses CPU
// parameters with one line instead of ATen's "not implemented" error.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
constexpr bool kCpuFusedAdamW = true;
#else
constexpr bool kCpuFusedAdamW = false;
#endif

// 13. GPU `index`'s compute capability as major * 10 + minor (80 for an A100, 90 for an H100):
// bf16 and TF32 need 80 or more. -1 in a CPU build.
inline int cuda_capability([[maybe_unused]] int index) {
#if defined(KIT_HAVE_NCCL)
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  return p->major * 10 + p->minor;
#else
  return -1;
#endif
}

// 14. A stream of its own for host-to-GPU copies (kit/data/device_batches.cpp), so that the next
// batch travels while the current stream's kernels compute: copy() starts a non_blocking copy on
// it (from pinned memory the host does not wait), hand_over() makes the current stream wait for
// the copy and tells the caching allocator that the tensor is used there. In a CPU build (or for
// a CPU device) copy() is Tensor::to and hand_over() does nothing.
class CopyStream {
 public:
  explicit CopyStream(c10::Device device) : device_(device) {
#if defined(KIT_HAVE_NCCL)
    if (device.is_cuda()) stream_.emplace(c10::cuda::getStreamFromPool(false, device.index()));
#endif
  }
  at::Tensor copy(const at::Tensor& host) {
#if defined(KIT_HAVE_NCCL)
    if (stream_) {
      c10::cuda::CUDAStreamGuard guard(*stream_);
      return host.to(device_, /*non_blocking=*/true);
    }
#endif
    return host.to(device_);
  }
  void hand_over([[maybe_unused]] at::Tensor& t) {
#if defined(KIT_HAVE_NCCL)
    if (stream_) {
      auto current = c10::cuda::getCurrentCUDAStream(device_.index());
      at::cuda::CUDAEvent copied;
      copied.record(*stream_);
      copied.block(current);
      t.record_stream(current);
    }
#endif
  }

 private:
  c10::Device device_;
#if defined(KIT_HAVE_NCCL)
  std::optional<c10::cuda::CUDAStream> stream_;
#endif
};

// 15. A Kineto event's times (kit/perf/profiler.cpp): PyTorch's PR 123650 (2024) gave
// KinetoEvent startNs(), endNs() and durationNs(); 2.2's has startUs() and durationUs() only
// (checked in its profiler_kineto.h). Chosen by whether the member exists, not by the version.
template <class Event>
uint64_t event_start_ns(const Event& e) {
  if constexpr (requires { e.startNs(); }) return e.startNs();
  else return static_cast<uint64_t>(e.startUs()) * 1000;
}
template <class Event>
uint64_t event_duration_ns(const Event& e) {
  if constexpr (requires { e.durationNs(); }) return e.durationNs();
  else return static_cast<uint64_t>(e.durationUs()) * 1000;
}
template <class Event>
uint64_t event_end_ns(const Event& e) {
  if constexpr (requires { e.endNs(); }) return e.endNs();
  else return event_start_ns(e) + event_duration_ns(e);
}

}  // namespace kit::compat

namespace kit {
class ProcessGroup;
// Wraps a c10d backend ("gloo" or "nccl") built on `store` (defined in process_group_make.cpp).
std::shared_ptr<ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const std::string& backend,
                                                 std::chrono::milliseconds timeout);
}  // namespace kit
