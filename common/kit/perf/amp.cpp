// kit/perf/amp.cpp — Autocast, the precisions a device can compute in, TF32 (see amp.h).
#include "kit/perf/amp.h"

#include <ATen/Context.h>

#include <cstdio>
#include <stdexcept>

#include "kit/compat.h"  // autocast's calls (they changed in 2.4), a GPU's compute capability

namespace kit {

Precision parse_precision(const std::string& name) {
  if (name == "fp32" || name == "none") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp16") return Precision::fp16;
  throw std::invalid_argument("unknown precision '" + name + "': fp32 (or none), bf16 or fp16");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    default: return "fp32";
  }
}

std::string precision_unsupported(Precision p, torch::Device device, int cuda_capability) {
  if (p == Precision::fp32) return "";
  if (device.is_cpu()) {
    if (p == Precision::fp16)
      return "fp16 autocast on a CPU: CPU kernels are made for bf16, and fp16 would need a "
             "gradient scaler for nothing there: use --amp bf16 on a CPU (fp16 is for GPUs)";
    return "";
  }
  if (device.is_cuda()) {
    const int cc = cuda_capability >= 0 ? cuda_capability : compat::cuda_capability(device.index());
    if (p == Precision::bf16 && cc < 80)
      return "bf16 on a GPU of compute capability " + std::to_string(cc / 10) + "." +
             std::to_string(cc % 10) + ": bf16 needs 8.0 (Ampere) or newer: use --amp fp16 (with "
             "its gradient scaler) on this GPU";
    return "";
  }
  return std::string("autocast on ") + device.str() + ": the kit knows CPU and CUDA only";
}

Autocast::Autocast(torch::Device device, Precision p, CallSite site) {
  if (p == Precision::fp32) return;
  if (std::string why = precision_unsupported(p, device); !why.empty())
    throw std::invalid_argument(why + " (" + site.str() + ")");
  type_ = device.type();
  was_enabled_ = compat::autocast_enabled(type_);
  was_dtype_ = compat::autocast_dtype(type_);
  was_caching_ = at::autocast::is_autocast_cache_enabled();
  compat::set_autocast_dtype(type_, p == Precision::bf16 ? c10::kBFloat16 : c10::kHalf);
  compat::set_autocast_enabled(type_, true);
  at::autocast::set_autocast_cache_enabled(true);
  at::autocast::increment_nesting();
  on_ = true;
}

Autocast::~Autocast() {
  if (!on_) return;
  // The outermost scope drops the weights autocast cast (and cached) for its forward.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(type_, was_enabled_);
  compat::set_autocast_dtype(type_, was_dtype_);
  at::autocast::set_autocast_cache_enabled(was_caching_);
}

void set_tf32(bool on, torch::Device device) {
  at::globalContext().setFloat32MatmulPrecision(on ? "high" : "highest");
  if (!on) return;
  if (device.is_cpu()) {
    std::fprintf(stderr, "kit: --tf32 on a CPU: TF32 is a mode of NVIDIA GPUs (Ampere and newer); "
                         "this CPU's fp32 matmuls stay fp32\n");
  } else if (device.is_cuda() && compat::cuda_capability(device.index()) < 80) {
    std::fprintf(stderr, "kit: --tf32 on a GPU older than Ampere (compute capability < 8.0): no "
                         "TF32 there, matmuls stay fp32\n");
  }
}

}  // namespace kit
