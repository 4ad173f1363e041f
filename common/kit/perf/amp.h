// kit/perf/amp.h — mixed precision and TF32: what `torch.autocast` and
// `torch.backends.cuda.matmul.allow_tf32` are in Python.
//
//   kit::Autocast amp(device, kit::Precision::bf16);   // a scope, as `with torch.autocast(...)`
//   auto loss = mse(model->forward(x), y);            // matmuls and convolutions in bf16
//   }                                                  // leave the scope before backward()
//
// Under autocast, ATen runs the operations that profit (matmuls, convolutions, linear layers) in
// the lower precision and those that need the range (softmax's sums, norms, losses) in fp32; the
// weights stay fp32 and so do their gradients. bf16 keeps fp32's exponent range: nothing else is
// needed. fp16 has 5 exponent bits: small gradients underflow to zero unless the loss is scaled
// first (kit/perf/grad_scaler.h). Where each is worth it:
//   bf16  CPUs (AVX512-BF16 or AMX make it fast; without them it can be slower than fp32) and
//         NVIDIA GPUs from Ampere on (compute capability 8.0)
//   fp16  every NVIDIA GPU, with a gradient scaler. Refused on a CPU: CPU kernels are made for
//         bf16, and fp16 would need the scaler for nothing there.
//   TF32  NVIDIA GPUs from Ampere on: fp32 matmuls with a 10-bit mantissa in the tensor cores,
//         the data left in fp32 (no autocast, no scaler). PyTorch's default since 1.12 is off
//         for matmuls (on for cuDNN's convolutions).
#pragma once

#include <string>

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include "kit/runtime/process_group.h"  // CallSite: an error names the line that made the scope

namespace kit {

enum class Precision { fp32, bf16, fp16 };

// "fp32" (or "none"), "bf16", "fp16"; std::invalid_argument with the three names otherwise.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision p);

// Why `device` cannot compute in `p`, with what to use instead, as one line; "" when it can.
// cuda_capability: the GPU's major * 10 + minor; -1 asks the device itself (the tests pass an
// older GPU's).
std::string precision_unsupported(Precision p, torch::Device device, int cuda_capability = -1);

// Autocast on `device`'s type in `p` for the lifetime of the object (fp32: nothing changes), as
// Python's `with torch.autocast(device_type, dtype)`: on exit the previous state comes back, and
// the outermost scope empties autocast's cache of casted weights. Autocast is per thread: it
// covers what this thread computes. A precision the device lacks is std::invalid_argument, with
// precision_unsupported()'s line and the caller's ("(train.cpp:143)").
class Autocast {
 public:
  Autocast(torch::Device device, Precision p, CallSite site = {});
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_ = false;
  c10::DeviceType type_ = c10::kCPU;
  bool was_enabled_ = false, was_caching_ = true;
  c10::ScalarType was_dtype_ = c10::kFloat;
};

// TF32 for fp32 matmuls, on or off (torch.set_float32_matmul_precision("high") or "highest"):
// ATen's setting for the whole process. On a CPU it is set too (ATen has one setting), and one
// line says that it changes nothing there: oneDNN lowers fp32 matmuls only on CPUs made for it;
// on the course's AVX512 CI machine a 256 x 256 matmul gives the same bits either way (torch
// 2.13). On a GPU older than Ampere, one line says the same.
void set_tf32(bool on, torch::Device device);

}  // namespace kit
