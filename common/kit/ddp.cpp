// kit/ddp.cpp — the gradient reducer behind DistributedDataParallel (see ddp.h).
#include "kit/ddp.h"

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "kit/buckets.h"
#include "kit/compat.h"
#include "kit/distributed.h"
#include "kit/trace.h"

namespace kit {

struct DistributedDataParallel::Reducer : std::enable_shared_from_this<Reducer> {
  struct Bucket {
    std::vector<size_t> params;   // parameter indices
    std::vector<int64_t> offset;  // where each one's gradient sits in `flat`
    torch::Tensor flat;           // all gradients of the bucket, back to back
    size_t pending = 0;           // gradients not yet copied in this step
    std::unique_ptr<Work> work;   // the all-reduce in flight
  };

  ProcessGroup* group;
  std::shared_ptr<ProcessGroup> keep_group;  // the default group stays valid (closed, not freed)
  Options options;
  std::vector<torch::Tensor> params;
  std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, slot)
  std::vector<Bucket> buckets;
  std::vector<std::vector<size_t>> assignment;   // buckets[k].params, for buckets()
  std::vector<compat::NodePtr> accumulators;  // keep them alive
  std::vector<uintptr_t> hook_keys;
  std::vector<bool> ready;
  size_t next_launch = 0;        // buckets start strictly in order, the same on every rank
  bool sync = true;              // false inside no_sync(): backward stays local
  bool finalizer_queued = false;
  DDPStats stats;
  std::mutex mutex;

  void launch_ready_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.work = std::make_unique<Work>(group->all_reduce_async({b.flat}, ReduceOp::AVG));
    }
  }

  // Called by autograd right after parameter i's gradient was accumulated into .grad.
  void on_gradient_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) return;  // no_sync(): the gradient stays in .grad and is averaged later
    if (!finalizer_queued) {
      // First gradient of this backward: ask autograd to call finalize() when backward ends.
      finalizer_queued = true;
      std::weak_ptr<Reducer> self = shared_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([self] {
        if (auto r = self.lock()) r->finalize();
      });
    }
    if (ready[i]) return;  // the same parameter used twice: its hook fires once per use
    ready[i] = true;
    auto [bi, slot] = where[i];
    Bucket& b = buckets[bi];
    copy_in(b, slot, i);
    if (--b.pending == 0 && options.overlap) launch_ready_buckets();
  }

  void copy_in(Bucket& b, size_t slot, size_t i) {
    torch::NoGradGuard no_grad;
    auto grad = params[i].grad();
    auto dst = b.flat.narrow(0, b.offset[slot], params[i].numel());
    if (grad.defined()) dst.copy_(grad.reshape(-1));
    else dst.zero_();
  }

  // End of backward: every rank must contribute every bucket, even with a parameter that got no
  // gradient this step (it counts as zero), or the others would wait for it forever.
  void finalize() {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < params.size(); ++i)
      if (!ready[i]) {
        auto [bi, slot] = where[i];
        copy_in(buckets[bi], slot, i);
        ready[i] = true;
        --buckets[bi].pending;
      }
    launch_ready_buckets();
    auto start = std::chrono::steady_clock::now();
    for (auto& b : buckets) b.work->wait();
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    torch::NoGradGuard no_grad;
    for (auto& b : buckets) {
      for (size_t slot = 0; slot < b.params.size(); ++slot) {
        auto& p = params[b.params[slot]];
        auto avg = b.flat.narrow(0, b.offset[slot], p.numel()).view(p.sizes());
        if (p.grad().defined()) p.mutable_grad().copy_(avg);
        else p.mutable_grad() = avg.clone();
      }
      b.pending = b.params.size();
      b.work.reset();
    }
    std::fill(ready.begin(), ready.end(), false);
    next_launch = 0;
    finalizer_queued = false;
    stats.steps++;
    stats.wait_seconds += waited;
    stats.last_wait_seconds = waited;
    if (trace::enabled())
      trace::record("ddp_step", "step=" + std::to_string(stats.steps) +
                                    " wait_us=" + std::to_string(static_cast<int64_t>(waited * 1e6)));
  }
};

namespace {

// Autograd calls this after a parameter's AccumulateGrad node has run, i.e. once .grad holds
// this step's gradient.
struct GradReadyHook : torch::autograd::FunctionPostHook {
  std::weak_ptr<DistributedDataParallel::Reducer> reducer;
  size_t index;
  GradReadyHook(std::weak_ptr<DistributedDataParallel::Reducer> r, size_t i)
      : reducer(std::move(r)), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto r = reducer.lock()) r->on_gradient_ready(index);
    return outputs;
  }
};

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 Options options)
    : reducer_(std::make_shared<Reducer>()) {
  Reducer& r = *reducer_;
  if (!options.group) r.keep_group = default_group_ptr();
  r.group = options.group ? options.group : r.keep_group.get();
  r.options = options;
  for (auto& p : module->parameters())
    if (p.requires_grad()) r.params.push_back(p);
  TORCH_CHECK(!r.params.empty(), "DistributedDataParallel: the model has no trainable parameters");

  // 1. Same starting point everywhere: rank 0's parameters and buffers, one broadcast per dtype.
  //    Not all through float32: that would round float64 weights and large int64 buffers, and
  //    change even rank 0's own model. Only bool and bfloat16 travel as uint8 / float32 (exact),
  //    in case the backend cannot broadcast them.
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state = module->parameters();
    for (auto& b : module->buffers()) state.push_back(b);
    auto wire = [](c10::ScalarType t) {
      return t == torch::kBool ? torch::kByte : t == torch::kBFloat16 ? torch::kFloat : t;
    };
    std::map<c10::ScalarType, std::vector<torch::Tensor>> by_type;  // same order on every rank
    for (auto& t : state) by_type[wire(t.scalar_type())].push_back(t);
    for (auto& [type, tensors] : by_type) {
      std::vector<torch::Tensor> flat_parts;
      for (auto& t : tensors) flat_parts.push_back(t.detach().reshape(-1).to(type));
      auto flat = torch::cat(flat_parts);
      r.group->broadcast(flat, 0);
      int64_t at = 0;
      for (auto& t : tensors) {
        t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
        at += t.numel();
      }
    }
  }

  // 2. Buckets, from the last parameter backwards (kit/buckets.h).
  std::vector<size_t> bytes;
  for (auto& p : r.params) {
    TORCH_CHECK(p.scalar_type() == r.params[0].scalar_type() && p.device() == r.params[0].device(),
                "DistributedDataParallel: all parameters must share one dtype and device");
    bytes.push_back(static_cast<size_t>(p.numel() * p.element_size()));
  }
  r.where.resize(r.params.size());
  r.assignment = assign_buckets(bytes, options.first_bucket_bytes, options.bucket_cap_bytes);
  for (auto& indices : r.assignment) {
    Reducer::Bucket b;
    int64_t size = 0;
    for (size_t slot = 0; slot < indices.size(); ++slot) {
      r.where[indices[slot]] = {r.buckets.size(), slot};
      b.offset.push_back(size);
      size += r.params[indices[slot]].numel();
    }
    b.params = indices;
    b.pending = indices.size();
    b.flat = torch::zeros({size}, r.params[0].options().requires_grad(false));
    r.buckets.push_back(std::move(b));
  }
  r.ready.assign(r.params.size(), false);
  r.stats.buckets = static_cast<int64_t>(r.buckets.size());

  // 3. One hook per parameter, on the node that accumulates its gradient.
  for (size_t i = 0; i < r.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(r.params[i]);
    r.hook_keys.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(reducer_, i)));
    r.accumulators.push_back(std::move(acc));
  }
  if (trace::enabled())
    trace::record("ddp", "params=" + std::to_string(r.params.size()) +
                             " buckets=" + std::to_string(r.buckets.size()) +
                             " overlap=" + std::to_string(options.overlap) +
                             " device=" + r.params[0].device().str());
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < reducer_->accumulators.size(); ++i)
    reducer_->accumulators[i]->del_post_hook(reducer_->hook_keys[i]);
}

DistributedDataParallel::NoSync::NoSync(std::shared_ptr<Reducer> r) : reducer_(std::move(r)) {
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->sync = false;
}

DistributedDataParallel::NoSync::~NoSync() {
  if (!reducer_) return;  // moved from
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->sync = true;
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(reducer_); }

const DDPStats& DistributedDataParallel::stats() const { return reducer_->stats; }
const std::vector<std::vector<size_t>>& DistributedDataParallel::buckets() const {
  return reducer_->assignment;
}

}  // namespace kit
