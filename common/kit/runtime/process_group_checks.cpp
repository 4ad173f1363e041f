// kit/runtime/process_group_checks.cpp — what every collective of ProcessGroup passes through
// before the backend sees its tensors (see process_group.h): enter() numbers the call, reports
// it to the checker (kit/check/observe.h), counts its bytes, refuses a closed group and, under
// KIT_DEBUG_COLLECTIVES=1, compares the call across ranks; wire() holds NCCL's device rule for
// every tensor; device() is the rank's device that rule means.
//
// Apart from the collectives (process_group.cpp) because none of this depends on which
// collective runs: it is the one gate, so a rule added here holds for every call at once.
#include "kit/runtime/process_group.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "kit/compat.h"
#include "kit/runtime/device_check.h"
#include "kit/runtime/process_group_impl.h"
#include "kit/check/observe.h"

namespace kit {

using detail::explain;

torch::Device ProcessGroup::device() const {
#if defined(KIT_HAVE_NCCL)
  // What torch.distributed stages object collectives through on NCCL: the current GPU, which
  // setup() selects (and each rank's thread does in local_groups()).
  if (backend_ == "nccl") return compat::current_cuda_device();
#endif
  if (impl_->fake_device) return device_check::device();
  return torch::Device(torch::kCPU);
}

namespace {
// KIT_DEBUG_COLLECTIVES=1 (what `kit check` runs with; PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL
// does the same): before each collective, the ranks all-gather a short description of it (its
// number, kind, reduction, element count, dtype and source line) and compare. A rank that calls a
// different collective, or the same one with another shape, is named at once, instead of a hang
// until the timeout or silently wrong numbers.
constexpr int64_t kCheckFields = 6;
const char* kKinds[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
int64_t kind_id(const char* kind) {
  for (int64_t i = 0; i < 5; ++i)
    if (std::strcmp(kKinds[i], kind) == 0) return i;
  return -1;
}
}  // namespace

// Every tensor handed to the backend passes here, so that NCCL's rule holds by construction: on
// NCCL (a clearer line than NCCL's own) and on Gloo under KIT_DEVICE_CHECK=nccl, where it is the
// whole point: a host tensor that works on Gloo would stop the first GPU run. Under the check,
// Gloo is given a CPU view of the tensor's fakegpu memory, and works in place on it.
torch::Tensor ProcessGroup::wire(const torch::Tensor& t, const Work::Impl& call) const {
  if (backend_ != "nccl" && !impl_->fake_device) return t;
  const torch::Device mine = device();
  const bool ok = backend_ == "nccl" ? t.is_cuda() : t.device() == mine;
  if (!ok)
    throw CommError(who() + ": " + call.what + " was given a tensor on " +
                    t.device().str() + ", but NCCL moves only tensors on the rank's device (" +
                    mine.str() + "): make it there, or send host values with kit::control" +
                    (impl_->fake_device ? " (KIT_DEVICE_CHECK=nccl)" : ""));
  return impl_->fake_device ? device_check::host_alias(t) : t;
}

std::string ProcessGroup::who() const {
  const std::string me = "rank " + std::to_string(impl_->world_rank);
  return impl_->name == "world" ? me : me + " in group " + impl_->name;
}

void ProcessGroup::require_member(const char* what, const CallSite* site) const {
  if (is_member()) return;
  const std::string me = "rank " + std::to_string(impl_->world_rank);
  throw CommError(me + ": " + what + (site ? " (" + site->str() + ")" : "") + " on group " +
                  impl_->name + ", which " + me + " is not a member of: new_group() gave this "
                  "rank a handle that says so (is_member() is false), and only the members may "
                  "use the group (PyTorch would skip the call with a warning)");
}

std::shared_ptr<Work::Impl> ProcessGroup::enter(const char* kind, const torch::Tensor& t,
                                                const char* op, const CallSite& site) {
  auto w = std::make_shared<Work::Impl>();
  const int64_t seq = ++seq_;
  w->what = std::string(kind) + " #" + std::to_string(seq) + " (" + site.str() + ")";
  w->group = impl_;
  w->who = who();
  w->timeout_s = impl_->timeout.count() / 1000;
  if (!impl_->alive) {
    // A group that an object kept (DDP's, ZeRO's, kit::control's traffic) reached after
    // destroy_process_group(): traced as the kit's own refusals are (distributed.cpp), so that the
    // checker blames the call that closed the group too early, not the caller that found it closed.
    observe::after_destroy(kind, &site);
    throw CommError(w->who + ": " + w->what +
                    " after destroy_process_group(): the process group is closed. "
                    "destroy_process_group() must be the last kit call of the program");
  }
  const int64_t bytes = t.defined() ? t.numel() * t.element_size() : 0;
  stats_.calls[kind] += 1;
  stats_.bytes[kind] += bytes;
  observe::collective(seq, kind, op, t, site, impl_->name);
  if (impl_->debug) {
    const int64_t numel = t.defined() ? t.numel() : 0;
    const int64_t dtype = t.defined() ? static_cast<int64_t>(t.scalar_type()) : -1;
    int64_t opid = -1;
    for (ReduceOp o : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN})
      if (std::strcmp(op, to_string(o)) == 0) opid = static_cast<int64_t>(o);
    // Control traffic: made on the host, staged through the rank's device (a barrier has no
    // tensor to take the device from, and NCCL moves nothing else).
    auto mine = torch::tensor({seq, kind_id(kind), opid, numel, dtype, static_cast<int64_t>(site.line)},
                              torch::kLong).to(device());
    auto all = torch::empty({size_ * kCheckFields}, mine.options());
    auto check = std::make_shared<Work::Impl>(*w);
    check->what = w->what + ", comparing it across ranks (KIT_DEBUG_COLLECTIVES)";
    auto all_wire = wire(all, *check), mine_wire = wire(mine, *check);
    try {
      check->work = impl_->backend->_allgather_base(all_wire, mine_wire);
    } catch (const std::exception& e) {
      throw CommError(explain(e.what(), *check));
    }
    Work(check).wait();
    auto v = all.cpu();
    auto at = [&](int r, int f) { return v[r * kCheckFields + f].item<int64_t>(); };
    for (int r = 0; r < size_; ++r) {
      bool same = true;
      for (int f = 0; f < kCheckFields - 1; ++f) same = same && at(r, f) == at(rank_, f);
      if (same) continue;
      auto describe = [&](int them) {
        int64_t k = at(them, 1);
        std::string s = (k >= 0 && k < 5 ? kKinds[k] : "?") + std::string(" #") +
                        std::to_string(at(them, 0)) + " of " + std::to_string(at(them, 3)) +
                        " elements (line " + std::to_string(at(them, 5)) + ")";
        return "rank " + std::to_string(global_rank(them)) + " called " + s;
      };
      throw CommError(who() + ": the ranks disagree on collective #" +
                      std::to_string(seq) + ": " + describe(std::min(r, rank_)) + ", " +
                      describe(std::max(r, rank_)) +
                      ". Every rank must call every collective, in the same order, with the "
                      "same shapes");
    }
  }
  return w;
}

}  // namespace kit
