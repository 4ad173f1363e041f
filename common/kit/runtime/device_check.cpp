// kit/runtime/device_check.cpp — the fakegpu device of KIT_DEVICE_CHECK=nccl (see device_check.h).
#include "kit/runtime/device_check.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "kit/compat.h"  // KIT_HAVE_FAKE_DEVICE (note 8)

#if KIT_HAVE_FAKE_DEVICE
#include <ATen/EmptyTensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>
#endif

namespace kit::device_check {
namespace {
// Host synchronisations on fakegpu (device_check.h), and whether this thread is inside ATen's
// CPU fallback, whose own copies are not the program's.
std::atomic<int64_t> g_host_syncs{0};
thread_local bool t_in_fallback = false;
}  // namespace

#if KIT_HAVE_FAKE_DEVICE
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kType, 0);

// Host memory, labelled as the device's: a tensor's device is its storage's.
struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n);
    return {p, p, &c10::free_cpu, kDevice};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &c10::free_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
Allocator g_allocator;

// One device, one stream, and nothing is ever asynchronous: events are no-ops. (Autograd's
// engine asks a device's guard for these as it does for a GPU.)
struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return kDevice; }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() <= 0, "fakegpu has one device, fakegpu:0 (KIT_DEVICE_CHECK)");
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream getDefaultStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    static int done;
    *event = &done;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

// What ATen asks of a device that is not built in. Random numbers come from the CPU's default
// generator (the one the checkpoints save), as a CPU run's do.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  at::Device getDeviceFromPtr(void*) const override { return kDevice; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    c10::DataPtr fresh = g_allocator.allocate(bytes);
    if (storage.data() != nullptr)
      std::memcpy(fresh.get(), storage.data(), std::min(bytes, storage.nbytes()));
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(bytes);
  }
};

c10::DispatchKeySet keys() { return c10::DispatchKeySet(c10::DispatchKey::PrivateUse1); }

// --- the native kernels: allocation, copies, resizing and views ---------------------------------
at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                 std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>,
                 std::optional<c10::MemoryFormat> format) {
  return at::detail::empty_generic(size, &g_allocator, keys(), c10::dtype_or_default(dtype),
                                   format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                         std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &g_allocator, keys(),
                                           c10::dtype_or_default(dtype));
}

// Any copy that involves fakegpu (either way, or within it): a CPU copy between aliases. One
// between fakegpu and the CPU that the program asked to block is a host synchronisation on a GPU.
at::Tensor copy_between(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (!non_blocking && self.is_cpu() != dst.is_cpu() && !t_in_fallback) ++g_host_syncs;
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

// A fakegpu value read on the host (item(), and whatever calls it): the host would wait for it.
at::Scalar local_scalar(const at::Tensor& self) {
  if (!t_in_fallback) ++g_host_syncs;
  return at::_local_scalar_dense(host_alias(self));
}

const at::Tensor& grow(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat>) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const size_t bytes = at::detail::computeStorageNbytesContiguous(
      size, impl->dtype().itemsize(), impl->storage_offset());
  at::native::maybe_resize_storage_cpu(impl, bytes);  // grows through the storage's allocator
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  grow(dst, self.sizes(), std::nullopt);
  return copy_between(self, dst, false);
}

// Whether set_data() may move a tensor between the CPU and fakegpu: yes, as between the CPU and a
// GPU (Module::to() moves parameters with set_data(), and PrivateUse1 is not on c10's list of
// dense backends that may).
bool shallow_copy_compatible(const at::Tensor& self, const at::Tensor& from) {
  auto plain = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.device().is_cpu() || t.device().type() == kType);
  };
  return plain(self) && plain(from);
}

// Every other operator: its CPU kernel, through ATen's fallback (inputs copied to the CPU, results
// copied back). Those copies are marked: the fake device's way of computing, not host syncs.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const bool outer = t_in_fallback;
  t_in_fallback = true;
  try {
    at::native::cpu_fallback(op, stack);
  } catch (...) {
    t_in_fallback = outer;
    throw;
  }
  t_in_fallback = outer;
}

void register_device() {
  c10::register_privateuse1_backend("fakegpu");
  c10::SetAllocator(kType, &g_allocator);
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  static c10::impl::DeviceGuardImplRegistrar guard(kType, new Guard());
  // Libraries made at run time: only a run that asks for the mode gets the device.
  static auto kernels = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", std::make_optional(c10::DispatchKey::PrivateUse1), __FILE__,
      __LINE__);
  kernels->impl("empty.memory_format", TORCH_FN(empty));
  kernels->impl("empty_strided", TORCH_FN(empty_strided));
  kernels->impl("_copy_from", TORCH_FN(copy_between));
  kernels->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  kernels->impl("_local_scalar_dense", TORCH_FN(local_scalar));
  kernels->impl("resize_", TORCH_FN(grow));
  // Views share their input's memory: the CPU versions only do arithmetic on sizes and strides.
  kernels->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  kernels->impl("view", TORCH_FN(at::native::view));
  kernels->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  kernels->impl("_has_compatible_shallow_copy_type", TORCH_FN(shallow_copy_compatible));
  kernels->impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_cpu_));
  static auto rest = std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", std::make_optional(c10::DispatchKey::PrivateUse1), __FILE__,
      __LINE__);
  rest->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace

#endif  // KIT_HAVE_FAKE_DEVICE

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KIT_DEVICE_CHECK");
    if (v == nullptr || *v == '\0') return false;
    if (std::strcmp(v, "nccl") == 0 && !KIT_HAVE_FAKE_DEVICE)
      throw std::runtime_error("KIT_DEVICE_CHECK=nccl needs LibTorch 2.13 or newer (this build: " +
                               std::to_string(TORCH_VERSION_MAJOR) + "." +
                               std::to_string(TORCH_VERSION_MINOR) + "): leave it unset");
    if (std::strcmp(v, "nccl") == 0) return true;
    throw std::runtime_error(std::string("KIT_DEVICE_CHECK=") + v +
                             " is not a check: use nccl (every tensor of a collective on the "
                             "rank's device, as NCCL requires) or leave it unset");
  }();
  return on;
}

#if KIT_HAVE_FAKE_DEVICE
torch::Device device() {
  static std::once_flag once;
  std::call_once(once, register_device);
  return kDevice;
}

torch::Tensor host_alias(const torch::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  TORCH_CHECK(t.device().type() == kType, "host_alias: a tensor on ", t.device().str());
  // The alias keeps the device tensor's memory alive as long as Gloo holds it.
  c10::Storage keep = t.storage();
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {},
                       t.options().device(at::kCPU));
}
#else   // enabled() is false or has thrown: nothing asks for the device
torch::Device device() { return torch::Device(torch::kCPU); }
torch::Tensor host_alias(const torch::Tensor& t) { return t; }
#endif

void count_host_syncs(torch::Device device) {
  // fakegpu counts all the time (a few increments); a GPU needs CUDA's sync debug mode on.
  if (device.is_cuda()) compat::count_cuda_syncs();
}

int64_t host_syncs() { return g_host_syncs.load() + compat::cuda_syncs(); }

}  // namespace kit::device_check
