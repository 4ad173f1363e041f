// kit/ddp/ddp.cpp — the gradient reducer behind DistributedDataParallel (see ddp.h).
#include "kit/ddp/ddp.h"

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "kit/ddp/buckets.h"
#include "kit/compat.h"
#include "kit/runtime/distributed.h"
#include "kit/ddp/param_claim.h"  // ParameterClaim: no ZeRO on the same model
#include "kit/check/observe.h"

namespace kit {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Parameter `like`'s gradient as a window on `flat` at `offset` (in elements): the same memory,
// no copy. Made with set_() rather than flat.narrow(...).view(...): autograd would mark a narrow()
// as a view of `flat`, and the optimizers' zero_grad() calls grad.detach_(), which autograd
// refuses on views.
torch::Tensor window(const torch::Tensor& flat, int64_t offset, const torch::Tensor& like) {
  return torch::empty({0}, flat.options())
      .set_(flat.storage(), flat.storage_offset() + offset, like.sizes());
}

// Rank 0's values of `state` into every rank's, in place: one broadcast per dtype. Not all
// through float32: that would round float64 weights and large int64 buffers, and change even rank
// 0's own model. Only bool and bfloat16 travel as uint8 / float32 (exact), in case the backend
// cannot broadcast them.
void broadcast_from_rank0(ProcessGroup& group, const std::vector<torch::Tensor>& state) {
  torch::NoGradGuard no_grad;
  auto wire = [](c10::ScalarType t) {
    return t == torch::kBool ? torch::kByte : t == torch::kBFloat16 ? torch::kFloat : t;
  };
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_type;  // same order on every rank
  for (auto& t : state) by_type[wire(t.scalar_type())].push_back(t);
  for (auto& [type, tensors] : by_type) {
    std::vector<torch::Tensor> flat_parts;
    for (auto& t : tensors) flat_parts.push_back(t.detach().reshape(-1).to(type));
    auto flat = torch::cat(flat_parts);
    group.broadcast(flat, 0);
    int64_t at = 0;
    for (auto t : tensors) {
      t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

}  // namespace

struct DistributedDataParallel::Reducer : std::enable_shared_from_this<Reducer> {
  struct Bucket {
    std::vector<size_t> params;   // parameter indices, in the order their gradients arrive
    torch::Tensor flat;           // all their gradients, back to back: what the all-reduce sends
    size_t pending = 0;           // gradients not yet complete in this step
    std::unique_ptr<Work> work;   // the all-reduce in flight
  };

  ProcessGroup* group;
  std::shared_ptr<ProcessGroup> keep_group;  // the default group stays valid (closed, not freed)
  Options options;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;                // of each parameter, for the errors
  std::string made_at;                           // the trainer's line that made the wrapper
  std::vector<torch::Tensor> buffers;            // what broadcast_buffers sends
  std::function<torch::Tensor(const torch::Tensor&)> call;  // the module's forward, if it has one
  bool forward_sync = true;      // PyTorch's require_forward_param_sync: broadcast at the next forward
  std::unique_ptr<ParameterClaim> claim;  // these parameters are ours while we live
  std::vector<size_t> bytes;                     // of each parameter's gradient
  std::vector<size_t> bucket_of;                 // param -> its bucket
  std::vector<torch::Tensor> windows;            // param -> its gradient's place in its bucket
  std::vector<Bucket> buckets;
  std::vector<std::vector<size_t>> assignment;   // buckets[k].params, for buckets()
  int64_t bucket_bytes = 0;                      // all buckets together
  std::vector<compat::NodePtr> accumulators;  // keep them alive
  std::vector<uintptr_t> hook_keys;
  std::vector<bool> ready;
  std::vector<size_t> arrived;   // the order of the gradients in the first backward (overlap only)
  size_t next_launch = 0;        // buckets start strictly in order, the same on every rank
  // PyTorch's require_backward_grad_sync: false inside no_sync(). It is read by the forward, not
  // by the backward (as PyTorch's prepare_for_backward): a forward through the wrapper with
  // gradients on arms the reducer for the next backward (armed) or, inside no_sync(), lets it
  // accumulate locally (local_forward). A backward whose forward did neither, e.g. one through
  // model->forward(), is refused at its first gradient (PyTorch's DDP would skip averaging it
  // without a word).
  bool sync = true;
  bool armed = false;            // the next backward averages (PyTorch's expect_autograd_hooks_)
  bool local_forward = false;    // a forward ran inside no_sync() since the last averaged backward
  // Parameters that got a gradient on this rank since the last averaged backward, no_sync()
  // micro-steps included (PyTorch's local_used_map): with find_unused_parameters, a parameter
  // used by any rank in any micro-step of the step gets the average on every rank.
  std::vector<bool> used;
  bool finalizer_queued = false;
  Clock::time_point first_launch;
  double copy_seconds = 0;       // this step's
  // On a GPU the wait and reduce times are device time (compat::record_gpu_event): marks on the
  // current stream at the first launch, before the waits and after them, this step's and the
  // last finished step's, read one step later (or by stats()) so that no step waits for the GPU
  // just to time itself.
  struct Marks {
    std::unique_ptr<compat::GpuEvent> launch, wait, done;
  };
  Marks this_step, last_step;
  DDPStats stats;
  std::mutex mutex;

  // The last finished GPU step's times, from its marks (a no-op without them, e.g. on the CPU).
  // wait = false (at the next backward's end): only if the device has passed them, else that
  // step goes untimed, as a host that runs ahead must not wait here; true (stats()): waits.
  void settle(bool wait) {
    Marks m = std::move(last_step);
    last_step = {};
    if (!m.done || !m.wait || !m.launch) return;
    if (!wait && !compat::gpu_event_done(*m.done)) return;
    const double waited = compat::gpu_seconds(*m.wait, *m.done);
    stats.wait_seconds += waited;
    stats.last_wait_seconds = waited;
    stats.last_reduce_seconds = compat::gpu_seconds(*m.launch, *m.done);
  }

  // Lays the buckets out (construction, and once more at the rebuild). A gradient that exists
  // already (made before DDP, or living in the old buckets) moves into its new place.
  void make_buckets(std::vector<std::vector<size_t>> layout) {
    torch::NoGradGuard no_grad;
    std::vector<Bucket> fresh;
    bucket_bytes = 0;
    for (auto& indices : layout) {
      Bucket b;
      int64_t size = 0;
      for (size_t i : indices) size += params[i].numel();
      b.flat = torch::zeros({size}, params[0].options().requires_grad(false));
      int64_t at = 0;
      for (size_t i : indices) {
        bucket_of[i] = fresh.size();
        windows[i] = window(b.flat, at, params[i]);
        at += params[i].numel();
        auto& grad = params[i].mutable_grad();
        if (grad.defined()) {
          windows[i].copy_(grad);
          grad = windows[i];
        }
      }
      b.params = indices;
      b.pending = indices.size();
      bucket_bytes += size * b.flat.element_size();
      fresh.push_back(std::move(b));
    }
    buckets = std::move(fresh);
    assignment = std::move(layout);
    stats.buckets = static_cast<int64_t>(buckets.size());
  }

  void launch_ready_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      if (next_launch == 0) {
        first_launch = Clock::now();
        if (params[0].is_cuda()) this_step.launch = compat::record_gpu_event(params[0].device());
      }
      Bucket& b = buckets[next_launch++];
      b.work = std::make_unique<Work>(group->all_reduce_async({b.flat}, ReduceOp::AVG));
      stats.all_reduces++;
    }
  }

  // Makes sure parameter i's gradient is in its bucket. Usually it is already: autograd added
  // this step's gradient into the window in place, and there is nothing to do. It is not after
  // zero_grad() set .grad to none (autograd then hands over a tensor of its own), when user code
  // replaced .grad, or for a parameter without a gradient: then its place holds zeros (every rank
  // must send something) and its .grad stays undefined until finalize() decides (PyTorch's
  // mark_variable_ready_dense and finalize_bucket_dense).
  void into_bucket(size_t i) {
    auto& grad = params[i].mutable_grad();
    const torch::Tensor& place = windows[i];
    if (grad.defined() && grad.data_ptr() == place.data_ptr()) return;
    auto start = Clock::now();
    torch::NoGradGuard no_grad;
    if (grad.defined()) {
      place.copy_(grad);
      grad = place;  // from now on autograd accumulates in place
    } else {
      place.zero_();
    }
    copy_seconds += seconds_since(start);
  }

  // Called by autograd right after parameter i's gradient was accumulated into .grad.
  void on_gradient_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    // A hook can fire with no gradient (an output that does not reach the loss): not a use.
    if (params[i].grad().defined()) used[i] = true;
    if (!armed) {
      if (local_forward) return;  // a no_sync() micro-step: the gradient stays in this rank's .grad
      // The wrapper's line in parentheses, "(train.cpp:117)": kit check places it in its TODO.
      TORCH_CHECK(false, "DistributedDataParallel (", made_at, "): a backward reached parameter '",
                  names[i], "', but no forward through the wrapper prepared it (model->forward(x) "
                  "instead of ddp.forward(x)?): PyTorch's DDP would not average these gradients "
                  "and the replicas would drift apart; run the training forward through "
                  "ddp.forward(x), as ddp_model(x) in Python");
    }
    if (!finalizer_queued) {
      // First gradient of this backward: ask autograd to call finalize() when backward ends.
      finalizer_queued = true;
      std::weak_ptr<Reducer> self = shared_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([self] {
        if (auto r = self.lock()) r->finalize();
      });
    }
    // A parameter used twice in one graph gets one hook call (autograd sums its uses first); a
    // second call means a second backward through it in this step, e.g. a reentrant checkpoint,
    // while its bucket may already be on the wire.
    TORCH_CHECK(!ready[i], "DistributedDataParallel: parameter '", names[i],
                "' got its gradient twice in one backward (reentrant activation checkpointing or "
                "a second backward through it before this one ended); its bucket may already be "
                "averaged: give each parameter one gradient per backward");
    ready[i] = true;
    if (options.overlap && !stats.rebuilt) arrived.push_back(i);
    into_bucket(i);
    if (--buckets[bucket_of[i]].pending == 0 && options.overlap) launch_ready_buckets();
  }

  // End of backward: every rank must contribute every bucket, even with a parameter that got no
  // gradient this step, or the others would wait for it forever. Such a parameter adds its .grad
  // if it has one (kept from no_sync() steps or zeroed in place), zeros otherwise, and its .grad
  // stays as it was: it becomes the average only where some rank used it in this step, its
  // no_sync() micro-steps included (PyTorch's find_unused_parameters and local_used_map). Without
  // that option the step still completes on every rank, so that no rank waits forever for this
  // one, and then fails naming the parameter.
  void finalize() {
    std::unique_lock<std::mutex> lock(mutex);
    std::vector<size_t> unused;
    for (size_t i = 0; i < params.size(); ++i) {
      if (ready[i]) continue;
      unused.push_back(i);
      torch::NoGradGuard no_grad;
      if (params[i].grad().defined()) into_bucket(i);
      else windows[i].zero_();
      ready[i] = true;
      --buckets[bucket_of[i]].pending;
    }
    launch_ready_buckets();
    settle(false);  // the previous step's GPU times, if the device is past them
    const bool gpu = params[0].is_cuda();
    if (gpu) this_step.wait = compat::record_gpu_event(params[0].device());
    auto start = Clock::now();
    for (auto& b : buckets) b.work->wait();  // the averages are now where .grad looks
    const double waited = seconds_since(start);
    // A parameter still without .grad gets the average, unless find_unused_parameters knows that
    // no rank used it in this step (then it stays undefined, so that AdamW leaves it alone).
    std::vector<bool> anywhere(params.size(), true);
    if (options.find_unused_parameters) {  // one small all-reduce, as PyTorch's local_used_map
      auto mine = torch::zeros({static_cast<int64_t>(params.size())});
      for (size_t i = 0; i < params.size(); ++i)
        if (used[i]) mine[static_cast<int64_t>(i)] = 1;
      auto all = control::all_reduce(*group, mine, ReduceOp::SUM);
      for (size_t i = 0; i < params.size(); ++i) anywhere[i] = all.data_ptr<float>()[i] > 0;
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (!params[i].grad().defined() && anywhere[i]) params[i].mutable_grad() = windows[i];
    if (gpu) {
      this_step.done = compat::record_gpu_event(params[0].device());
      last_step = std::move(this_step);
      this_step = {};
    }

    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
    }
    std::fill(ready.begin(), ready.end(), false);
    std::fill(used.begin(), used.end(), false);
    armed = false;
    local_forward = false;
    next_launch = 0;
    finalizer_queued = false;
    stats.steps++;
    if (!gpu) {  // on a GPU: settle()
      stats.wait_seconds += waited;
      stats.last_wait_seconds = waited;
      stats.last_reduce_seconds = seconds_since(first_launch);
    }
    stats.last_copy_seconds = copy_seconds;
    stats.last_reduce_bytes = bucket_bytes;
    copy_seconds = 0;
    observe::ddp_step(stats.steps, waited);
    observe::ddp_gradients(stats.steps, names, params);  // the first step's, for the checker
    if (options.overlap && !stats.rebuilt) rebuild_buckets();
    if (!unused.empty() && !options.find_unused_parameters) {
      std::string list;
      for (size_t i : unused) list += (list.empty() ? "'" : ", '") + names[i] + "'";
      lock.unlock();
      TORCH_CHECK(false, "DistributedDataParallel: ", unused.size() == 1 ? "parameter " : "parameters ",
                  list, " got no gradient in this backward (not "
                  "used to compute the loss); pass Options{.find_unused_parameters = true} if some "
                  "parameters may sit out a step, or leave them out of the model");
    }
  }

  // Before a forward through the wrapper: rank 0's buffers everywhere (broadcast_buffers), when
  // the previous forward ran with gradients and outside no_sync() (PyTorch's rule).
  void before_forward() {
    std::lock_guard<std::mutex> lock(mutex);
    if (options.broadcast_buffers && forward_sync && !buffers.empty()) {
      broadcast_from_rank0(*group, buffers);
      observe::ddp_buffers(buffers.size());
    }
  }
  // After it: a forward with gradients arms the next backward (outside no_sync()) or lets it
  // accumulate locally (inside), as PyTorch's _post_forward; and the next forward broadcasts the
  // buffers only after one that will be averaged, so once per averaged step.
  void after_forward() {
    std::lock_guard<std::mutex> lock(mutex);
    const bool grad = torch::GradMode::is_enabled();
    forward_sync = grad && sync;
    if (grad && sync) armed = true;
    if (grad && !sync) local_forward = true;
  }

  // After the first backward: buckets in the order the gradients really arrived, so that each
  // one is complete as early as possible (the guess, reverse parameter order, can be wrong: an LM
  // head's bias arrives before its weight). Every rank must build the same buckets, and the
  // arrival order may differ between ranks (a branch taken on one rank only), so all take rank
  // 0's: one broadcast, once. Parameters that got no gradient go last. The averaged gradients of
  // this step move along into the new buckets (the optimizer has not used them yet).
  void rebuild_buckets() {
    std::vector<int64_t> order(arrived.begin(), arrived.end());
    std::vector<bool> seen(params.size(), false);
    for (size_t i : arrived) seen[i] = true;
    for (size_t i = params.size(); i-- > 0;)
      if (!seen[i]) order.push_back(static_cast<int64_t>(i));
    // Control traffic (kit::control): staged through the rank's device, back on the host.
    auto wire = control::broadcast(*group, torch::tensor(order, torch::kLong), 0);
    std::vector<size_t> agreed(wire.data_ptr<int64_t>(), wire.data_ptr<int64_t>() + wire.numel());
    make_buckets(assign_buckets(bytes, options.first_bucket_bytes, options.bucket_cap_bytes, agreed));
    stats.rebuilt = true;
    arrived.clear();
    observe::ddp_rebuild(buckets.size());
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
                                                 Options options, CallSite site)
    : reducer_(std::make_shared<Reducer>()) {
  Reducer& r = *reducer_;
  r.made_at = site.str();
  r.keep_group = group_or_world(options.group, "DistributedDataParallel");
  r.group = r.keep_group.get();
  r.options = options;
  for (auto& item : module->named_parameters())
    if (item.value().requires_grad()) {
      r.params.push_back(item.value());
      r.names.push_back(item.key());
    }
  r.buffers = module->buffers();
  TORCH_CHECK(!r.params.empty(), "DistributedDataParallel: the model has no trainable parameters");
  r.claim = std::make_unique<ParameterClaim>(r.params, "DistributedDataParallel");

  // 1. Same starting point everywhere: rank 0's parameters and buffers.
  {
    std::vector<torch::Tensor> state = module->parameters();
    for (auto& b : r.buffers) state.push_back(b);
    broadcast_from_rank0(*r.group, state);
  }

  // 2. Buckets, from the last parameter backwards (kit/ddp/buckets.h), until the first backward
  //    shows the real order.
  for (auto& p : r.params) {
    TORCH_CHECK(p.scalar_type() == r.params[0].scalar_type() && p.device() == r.params[0].device(),
                "DistributedDataParallel: all parameters must share one dtype and device");
    r.bytes.push_back(static_cast<size_t>(p.numel() * p.element_size()));
  }
  r.bucket_of.resize(r.params.size());
  r.windows.resize(r.params.size());
  r.make_buckets(assign_buckets(r.bytes, options.first_bucket_bytes, options.bucket_cap_bytes));
  r.ready.assign(r.params.size(), false);
  r.used.assign(r.params.size(), false);

  // 3. One hook per parameter, on the node that accumulates its gradient.
  for (size_t i = 0; i < r.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(r.params[i]);
    r.hook_keys.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(reducer_, i)));
    r.accumulators.push_back(std::move(acc));
  }
  observe::ddp(r.params.size(), r.buckets.size(), options.overlap, r.params[0].device());
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < reducer_->accumulators.size(); ++i)
    reducer_->accumulators[i]->del_post_hook(reducer_->hook_keys[i]);
}

DistributedDataParallel::NoSync::NoSync(std::shared_ptr<Reducer> r) : reducer_(std::move(r)) {
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->sync = false;
  // The checker tells "every backward ran inside no_sync()" from "DDP was a temporary" by this.
  observe::ddp_no_sync();
}

DistributedDataParallel::NoSync::~NoSync() {
  if (!reducer_) return;  // moved from
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->sync = true;
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(reducer_); }

void DistributedDataParallel::set_forward(std::function<torch::Tensor(const torch::Tensor&)> call) {
  reducer_->call = std::move(call);
}

torch::Tensor DistributedDataParallel::forward(const torch::Tensor& input) {
  TORCH_CHECK(reducer_->call, "DistributedDataParallel::forward: the module has no "
              "forward(Tensor) -> Tensor; run it through ddp.forward_with([&] { return "
              "model->forward(...); })");
  return forward_with([&] { return reducer_->call(input); });
}

void DistributedDataParallel::before_forward() { reducer_->before_forward(); }
void DistributedDataParallel::after_forward() { reducer_->after_forward(); }

const DDPStats& DistributedDataParallel::stats() const {
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->settle(true);
  return reducer_->stats;
}
const std::vector<std::vector<size_t>>& DistributedDataParallel::buckets() const {
  return reducer_->assignment;
}

}  // namespace kit
