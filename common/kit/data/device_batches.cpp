// kit/data/device_batches.cpp — DeviceCopier: the copy of the next batch (see device_batches.h).
#include "kit/data/device_batches.h"

#include "kit/compat.h"  // CopyStream: a CUDA stream of its own for the copies (a no-op on a CPU)

namespace kit {

struct DeviceCopier::Impl {
  explicit Impl(torch::Device device) : stream(device) {}
  compat::CopyStream stream;
  Batch next;
};

DeviceCopier::DeviceCopier(torch::Device device) : impl_(std::make_unique<Impl>(device)) {}
DeviceCopier::~DeviceCopier() = default;

void DeviceCopier::start(const Batch& host) {
  impl_->next = {impl_->stream.copy(host.input), impl_->stream.copy(host.target)};
}

Batch DeviceCopier::take() {
  Batch b = std::move(impl_->next);
  impl_->stream.hand_over(b.input);
  impl_->stream.hand_over(b.target);
  return b;
}

}  // namespace kit
