// kit/compat.h — the only place that knows LibTorch versions apart (1.13 on Debian, 2.x on the
// clusters). Included by kit's .cpp files only; exercises and solutions never see it.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if defined(KIT_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace kit::compat {

// 2.0 split "process group" (the user-facing object) from "backend" (Gloo, NCCL, ...); the
// collectives we call live on the backend in 2.x and on ProcessGroup in 1.13.
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif
using BackendPtr = c10::intrusive_ptr<Backend>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// Gloo has no AVG reduction in 1.13 (NCCL has had it since 2.10): callers SUM and divide.
constexpr bool kGlooHasAvg = false;

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

#if defined(KIT_HAVE_NCCL)
inline BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                            std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
inline void set_cuda_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }
#endif

}  // namespace kit::compat

namespace kit {
class ProcessGroup;
// Wraps a c10d backend ("gloo" or "nccl") built on `store` (defined in process_group.cpp).
std::shared_ptr<ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const std::string& backend,
                                                 std::chrono::milliseconds timeout);
}  // namespace kit
