// kit/runtime/control.cpp — kit::control (see process_group.h): small host values the ranks must
// agree on, staged through the group's device, as torch.distributed's object collectives are on
// NCCL.
//
// Apart from ProcessGroup because it is a layer above it: it uses only the group's public face
// (device() and three collectives). Every exchange of host values in the kit comes through here.
#include "kit/runtime/process_group.h"

namespace kit {

namespace control {
namespace {
// The values on the group's device, in a buffer of their own (the collective writes into it).
torch::Tensor staged(ProcessGroup& group, const torch::Tensor& values) {
  return values.detach().to(group.device(), /*non_blocking=*/false, /*copy=*/true).contiguous();
}
}  // namespace

torch::Tensor all_reduce(ProcessGroup& group, const torch::Tensor& values, ReduceOp op,
                         CallSite site) {
  auto t = staged(group, values);
  group.all_reduce(t, op, site);
  return t.cpu();
}

torch::Tensor all_gather(ProcessGroup& group, const torch::Tensor& values, CallSite site) {
  group.require_member("control::all_gather", &site);  // before size(), which is -1 outside
  auto t = staged(group, values);
  auto all = torch::empty({group.size() * t.numel()}, t.options());
  group.all_gather(all, t, site);
  return all.cpu();
}

torch::Tensor broadcast(ProcessGroup& group, const torch::Tensor& values, int root,
                        CallSite site) {
  auto t = staged(group, values);
  group.broadcast(t, root, site);
  return t.cpu();
}
}  // namespace control

}  // namespace kit
