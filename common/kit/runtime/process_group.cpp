// kit/runtime/process_group.cpp — ProcessGroup on top of c10d (see process_group.h).
#include "kit/runtime/process_group.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include <torch/cuda.h>

#include "kit/compat.h"
#include "kit/runtime/device_check.h"
#include "kit/check/observe.h"

namespace kit {

struct Work::Impl {
  compat::WorkPtr work;
  std::vector<torch::Tensor> tensors;
  torch::Tensor flat;    // defined: `tensors` travel packed in this one buffer (see all_reduce_async)
  torch::Tensor gathered, gather_into;  // all_gather through a list: copy the list into the output
  std::vector<torch::Tensor> gather_list;
  // For the error message: which call this is.
  std::string what;      // "all_reduce #3 (train.cpp:56)"
  int rank = 0;
  int64_t timeout_s = 0;
};

struct ProcessGroup::Impl {
  compat::BackendPtr backend;
  c10::intrusive_ptr<c10d::Store> store;  // kept alive as long as the group
  std::chrono::milliseconds timeout{0};
  bool alive = true;
  bool debug = false;  // KIT_DEBUG_COLLECTIVES=1: compare every call across ranks first
  bool fake_device = false;  // KIT_DEVICE_CHECK=nccl: tensors live on fakegpu, Gloo gets aliases
  std::mutex mutex;    // DDP's hooks start collectives from autograd's threads
};

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::MIN: return "MIN";
  }
  return "?";
}

std::string CallSite::str() const {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return c10d::ReduceOp::SUM;
    case ReduceOp::AVG: return c10d::ReduceOp::AVG;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// c10d errors are long, multi-line and full of source paths; keep the first line.
std::string first_line(const std::string& what) {
  auto end = what.find('\n');
  return what.substr(0, end);
}

// What a failed wait() most likely means, in words a student can act on.
std::string explain(const std::string& error, const Work::Impl& w) {
  std::string lower = error;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string who = "rank " + std::to_string(w.rank) + ": " + w.what;
  if (lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos)
    return who + " timed out after " + std::to_string(w.timeout_s) +
           " s: the other ranks never joined it. Usually a collective that not every rank calls "
           "(one inside `if (rank == 0)`), or ranks calling collectives in a different order: "
           "every rank must call every collective, in the same order";
  if (lower.find("closed") != std::string::npos || lower.find("reset by peer") != std::string::npos ||
      lower.find("broken pipe") != std::string::npos)
    return who + " failed: another rank left the job (it died, or it finished without calling "
           "this collective): " + first_line(error);
  return who + " failed: " + first_line(error);
}

}  // namespace

void Work::wait() {
  try {
    impl_->work->wait();
  } catch (const std::exception& e) {
    throw CommError(explain(e.what(), *impl_));
  }
  if (impl_->flat.defined()) {
    int64_t at = 0;
    for (auto& t : impl_->tensors) {
      t.copy_(impl_->flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
  if (!impl_->gather_list.empty())
    impl_->gather_into.copy_(torch::cat(impl_->gather_list).view(impl_->gather_into.sizes()));
}

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl, int rank, int size, std::string backend)
    : impl_(std::move(impl)), rank_(rank), size_(size), backend_(std::move(backend)) {
  const char* debug = std::getenv("KIT_DEBUG_COLLECTIVES");
  impl_->debug = debug && std::strcmp(debug, "1") == 0 && size_ > 1;
  impl_->fake_device = backend_ == "gloo" && device_check::enabled();
}

torch::Device ProcessGroup::device() const {
#if defined(KIT_HAVE_NCCL)
  // What torch.distributed stages object collectives through on NCCL: the current GPU, which
  // setup() selects (and each rank's thread does in local_groups()).
  if (backend_ == "nccl") return compat::current_cuda_device();
#endif
  if (impl_->fake_device) return device_check::device();
  return torch::Device(torch::kCPU);
}

ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::alive() const { return impl_->alive; }

void ProcessGroup::shutdown() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->alive = false;
  if (impl_->backend) compat::shutdown_backend(*impl_->backend);
  impl_->backend.reset();
}

// KIT_DEBUG_COLLECTIVES=1 (what `kit check` runs with; PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL
// does the same): before each collective, the ranks all-gather a short description of it (its
// number, kind, reduction, element count, dtype and source line) and compare. A rank that calls a
// different collective, or the same one with another shape, is named at once, instead of a hang
// until the timeout or silently wrong numbers.
namespace {
constexpr int64_t kFields = 6;
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
    throw CommError("rank " + std::to_string(rank_) + ": " + call.what + " was given a tensor on " +
                    t.device().str() + ", but NCCL moves only tensors on the rank's device (" +
                    mine.str() + "): make it there, or send host values with kit::control" +
                    (impl_->fake_device ? " (KIT_DEVICE_CHECK=nccl)" : ""));
  return impl_->fake_device ? device_check::host_alias(t) : t;
}

std::shared_ptr<Work::Impl> ProcessGroup::enter(const char* kind, const torch::Tensor& t,
                                                const char* op, const CallSite& site) {
  auto w = std::make_shared<Work::Impl>();
  const int64_t seq = ++seq_;
  w->what = std::string(kind) + " #" + std::to_string(seq) + " (" + site.str() + ")";
  w->rank = rank_;
  w->timeout_s = impl_->timeout.count() / 1000;
  if (!impl_->alive)
    throw CommError("rank " + std::to_string(rank_) + ": " + w->what +
                    " after destroy_process_group(): the process group is closed. "
                    "destroy_process_group() must be the last kit call of the program");
  const int64_t bytes = t.defined() ? t.numel() * t.element_size() : 0;
  stats_.calls[kind] += 1;
  stats_.bytes[kind] += bytes;
  observe::collective(seq, kind, op, t, site);
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
    auto all = torch::empty({size_ * kFields}, mine.options());
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
    auto at = [&](int r, int f) { return v[r * kFields + f].item<int64_t>(); };
    for (int r = 0; r < size_; ++r) {
      bool same = true;
      for (int f = 0; f < kFields - 1; ++f) same = same && at(r, f) == at(rank_, f);
      if (same) continue;
      auto describe = [&](int who) {
        int64_t k = at(who, 1);
        std::string s = (k >= 0 && k < 5 ? kKinds[k] : "?") + std::string(" #") +
                        std::to_string(at(who, 0)) + " of " + std::to_string(at(who, 3)) +
                        " elements (line " + std::to_string(at(who, 5)) + ")";
        return "rank " + std::to_string(who) + " called " + s;
      };
      throw CommError("rank " + std::to_string(rank_) + ": the ranks disagree on collective #" +
                      std::to_string(seq) + ": " + describe(std::min(r, rank_)) + ", " +
                      describe(std::max(r, rank_)) +
                      ". Every rank must call every collective, in the same order, with the "
                      "same shapes");
    }
  }
  return w;
}

Work ProcessGroup::all_reduce_async(std::vector<torch::Tensor> tensors, ReduceOp op,
                                    CallSite site) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // c10d reads a list of tensors as "one tensor per local GPU": they must all have one shape,
  // and it reduces over the list too ({a, b} would come back as a + b in both). Several tensors
  // therefore travel packed in one flat buffer, unpacked in wait().
  torch::Tensor send = tensors.empty() ? torch::Tensor() : tensors[0];
  torch::Tensor flat;
  if (tensors.size() > 1) {
    std::vector<torch::Tensor> parts;
    for (auto& t : tensors) {
      if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device())
        throw CommError("all_reduce: the tensors of one call must share one dtype and device");
      parts.push_back(t.detach().reshape(-1));
    }
    flat = torch::cat(parts);
    send = flat;
  }
  auto w = enter("all_reduce", send, to_string(op), site);
  w->flat = flat;
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  std::vector<torch::Tensor> list{wire(send, *w)};
  try {
    w->work = impl_->backend->allreduce(list, opts);
  } catch (const std::exception& e) {
    throw CommError(explain(e.what(), *w));
  }
  w->tensors = std::move(tensors);
  return Work(w);
}

void ProcessGroup::broadcast(torch::Tensor tensor, int root, CallSite site) {
  std::shared_ptr<Work::Impl> w;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    w = enter("broadcast", tensor, "-", site);
    std::vector<torch::Tensor> ts{wire(tensor, *w)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    try {
      w->work = impl_->backend->broadcast(ts, opts);
    } catch (const std::exception& e) {
      throw CommError(explain(e.what(), *w));
    }
  }
  Work(w).wait();
}

Work ProcessGroup::all_gather_async(torch::Tensor output, torch::Tensor input, CallSite site) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (output.numel() != size_ * input.numel() || output.scalar_type() != input.scalar_type())
    throw CommError("all_gather (" + site.str() + "): the output must hold world size (" +
                    std::to_string(size_) + ") x the input's " + std::to_string(input.numel()) +
                    " elements of the same dtype, it holds " + std::to_string(output.numel()));
  auto w = enter("all_gather", input, "-", site);
  auto in = input.contiguous();
  // One flat buffer for everybody's part (c10d's "allgather into tensor"), or one tensor per
  // rank, copied into the output in wait().
  std::vector<std::vector<torch::Tensor>> outs(1);
  std::vector<torch::Tensor> ins{wire(in, *w)};
  if (output.is_contiguous()) {
    outs[0].push_back(wire(output, *w));
  } else {
    for (int r = 0; r < size_; ++r) w->gather_list.push_back(torch::empty_like(in));
    for (auto& o : w->gather_list) outs[0].push_back(wire(o, *w));
    w->gather_into = output;
  }
  try {
    w->work = output.is_contiguous() ? impl_->backend->_allgather_base(outs[0][0], ins[0])
                                     : impl_->backend->allgather(outs, ins);
  } catch (const std::exception& e) {
    throw CommError(explain(e.what(), *w));
  }
  return Work(w);
}

Work ProcessGroup::reduce_scatter_async(torch::Tensor output, torch::Tensor input, ReduceOp op,
                                        CallSite site) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (input.numel() != size_ * output.numel() || output.scalar_type() != input.scalar_type())
    throw CommError("reduce_scatter (" + site.str() + "): the input must hold world size (" +
                    std::to_string(size_) + ") x the output's " + std::to_string(output.numel()) +
                    " elements of the same dtype, it holds " + std::to_string(input.numel()));
  auto w = enter("reduce_scatter", input, to_string(op), site);
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op);
  // c10d's flat reduce-scatter (on Gloo an all-reduce inside c10d: kit/compat.h, note 3).
  auto out = output.is_contiguous() ? output : output.contiguous();
  auto in = input.contiguous();
  auto out_wire = wire(out, *w), in_wire = wire(in, *w);
  try {
    w->work = impl_->backend->_reduce_scatter_base(out_wire, in_wire, opts);
  } catch (const std::exception& e) {
    throw CommError(explain(e.what(), *w));
  }
  if (!out.is_same(output)) {  // a non-contiguous output gets the result in wait()
    w->flat = out;
    w->tensors = {output};
  }
  return Work(w);
}

Work ProcessGroup::reduce_scatter_scratch_async(torch::Tensor output, torch::Tensor input,
                                                ReduceOp op, CallSite site) {
  if (backend_ == "nccl" || !input.is_contiguous()) return reduce_scatter_async(output, input, op, site);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (input.numel() != size_ * output.numel() || output.scalar_type() != input.scalar_type())
    throw CommError("reduce_scatter (" + site.str() + "): the input must hold world size (" +
                    std::to_string(size_) + ") x the output's " + std::to_string(output.numel()) +
                    " elements of the same dtype, it holds " + std::to_string(input.numel()));
  auto w = enter("reduce_scatter", input, to_string(op), site);
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  std::vector<torch::Tensor> list{wire(input, *w)};
  try {
    w->work = impl_->backend->allreduce(list, opts);
  } catch (const std::exception& e) {
    throw CommError(explain(e.what(), *w));
  }
  // wait() copies this rank's chunk of the reduced input into the output.
  w->flat = input.narrow(0, rank_ * output.numel(), output.numel());
  w->tensors = {output};
  return Work(w);
}

void ProcessGroup::barrier(CallSite site) {
  std::shared_ptr<Work::Impl> w;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    w = enter("barrier", torch::Tensor(), "-", site);
    try {
      w->work = impl_->backend->barrier();
    } catch (const std::exception& e) {
      throw CommError(explain(e.what(), *w));
    }
  }
  Work(w).wait();
}

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

bool ProcessGroup::nccl_built() { return compat::kHaveNccl; }

std::string ProcessGroup::nccl_unavailable(int ranks) {
  if (!compat::kHaveNccl)
    return "this LibTorch is a CPU build without CUDA/NCCL (configure against a CUDA build of "
           "torch to run on GPUs)";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string mask = visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "";
  if (!torch::cuda::is_available()) return "no GPU visible to this process" + mask;
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (ranks > gpus)
    return "needs " + std::to_string(ranks) + " GPUs (NCCL puts each rank on a GPU of its own), " +
           std::to_string(gpus) + " visible" + mask;
  return "";
}

std::vector<std::shared_ptr<ProcessGroup>> ProcessGroup::local_groups(
    int n, std::chrono::milliseconds timeout, const std::string& backend) {
  if (backend != "gloo" && backend != "nccl")
    throw CommError("local_groups: '" + backend + "' is not a backend: use gloo or nccl");
  if (backend == "nccl") {
    if (std::string why = nccl_unavailable(n); !why.empty())
      throw CommError("local_groups: " + std::to_string(n) + " NCCL ranks cannot run here: " + why);
  }
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  // Creating a Gloo group is itself collective (every rank connects to every other), so the
  // n constructors must run at the same time. NCCL connects later, at each rank's first
  // collective, on the GPU of the tensors it is given.
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto impl = std::make_shared<Impl>();
        impl->store = store;
        impl->timeout = timeout;
#if defined(KIT_HAVE_NCCL)
        if (backend == "nccl") {
          // Created with rank r's GPU current, as in a process of its own: whatever c10d does
          // on the current device while it builds the group happens on cuda:r, not on cuda:0
          // for every rank. (The current device is per thread: the thread that later calls
          // rank r's collectives selects cuda:r itself.)
          compat::set_cuda_device(r);
          compat::nccl_async_error_handling();
          impl->backend = compat::make_nccl(store, r, n, timeout);
        }
#endif
        if (backend == "gloo") impl->backend = compat::make_gloo(store, r, n, timeout);
        groups[r] = std::make_shared<ProcessGroup>(impl, r, n, backend);
      } catch (const std::exception& e) {
        errors[r] = first_line(e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[r].empty())
      throw CommError("local_groups: rank " + std::to_string(r) + " of " + std::to_string(n) +
                      " could not create its " + backend + " group: " + errors[r]);
  return groups;
}

std::shared_ptr<ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const std::string& backend,
                                                 std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->store = store;
  impl->timeout = timeout;
#if defined(KIT_HAVE_NCCL)
  if (backend == "nccl") {
    compat::nccl_async_error_handling();  // before the group reads it
    impl->backend = compat::make_nccl(store, rank, size, timeout);
  }
#endif
  if (backend == "gloo") impl->backend = compat::make_gloo(store, rank, size, timeout);
  if (!impl->backend) throw CommError("backend '" + backend + "' is not available in this LibTorch");
  return std::make_shared<ProcessGroup>(impl, rank, size, backend);
}

}  // namespace kit
