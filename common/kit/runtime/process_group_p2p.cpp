// kit/runtime/process_group_p2p.cpp — send and receive between two ranks of a ProcessGroup (see
// process_group.h): isend, irecv, batch_isend_irecv, their numbering per peer and direction, their
// trace, and KIT_DEBUG_COLLECTIVES's description sent ahead of each message.
//
// Apart from the collectives (process_group.cpp) because a point-to-point call involves two ranks,
// not the group: it is numbered per peer and direction (rank 0's third send to rank 1 meets rank
// 1's third receive from rank 0, whatever else either rank did in between), and the cross-rank
// comparison is a message to the one peer instead of an all-gather over everybody.
#include "kit/runtime/process_group.h"

#include <algorithm>
#include <mutex>

#include "kit/check/observe.h"
#include "kit/compat.h"
#include "kit/runtime/process_group_impl.h"

namespace kit {

using detail::explain;

namespace {

// The tags of the debug descriptions (Gloo tells messages apart by tag; NCCL by order, and the
// description always goes right before its message). A user's tag must stay below.
constexpr int kTagLimit = 1 << 30;
// One description: the message's number for this direction, the caller's line, dtype, number of
// dimensions and up to kDims sizes (a tensor of more dimensions is compared on its first kDims
// and its element count).
constexpr int64_t kDims = 6;
constexpr int64_t kP2pFields = 5 + kDims;

const char* kind_name(int kind) { return kind == ProcessGroup::P2POp::kSend ? "send" : "recv"; }

}  // namespace

std::shared_ptr<Work::Impl> ProcessGroup::enter_p2p(const P2POp& op, const CallSite& site) {
  const char* kind = kind_name(op.kind);
  require_member(kind, &site);
  const std::string call = who() + ": " + kind + " (" + site.str() + ")";
  const std::string where = name() == "world" ? "the world" : "group " + name();
  if (op.peer < 0 || op.peer >= size_)
    throw CommError(call + ": peer " + std::to_string(op.peer) + " is not a rank of " + where +
                    " (0 to " + std::to_string(size_ - 1) + ")");
  if (op.peer == rank_)
    throw CommError(call + ": peer " + std::to_string(op.peer) + " is this rank itself: a rank "
                    "cannot send to or receive from itself (torch.distributed refuses it too)");
  if (op.tag < 0 || op.tag >= kTagLimit)
    throw CommError(call + ": tag " + std::to_string(op.tag) + " is outside 0 to 2^30 - 1 (" +
                    std::to_string(kTagLimit - 1) + ")");
  if (!op.tensor.defined()) throw CommError(call + " was given no tensor");
  const int peer = global_rank(op.peer);
  auto w = std::make_shared<Work::Impl>();
  const int64_t seq = ++p2p_seq_[{op.kind, op.peer}];
  w->what = std::string(kind) + " #" + std::to_string(seq) + (op.kind == P2POp::kSend ? " to" : " from") +
            " rank " + std::to_string(peer) + " (" + site.str() + ")";
  w->group = impl_;
  w->who = who();
  w->timeout_s = impl_->timeout.count() / 1000;
  w->p2p = std::make_shared<Work::Impl::P2P>();
  w->p2p->kind = op.kind;
  w->p2p->peer = peer;
  w->p2p->seq = seq;
  w->p2p->group = impl_->name;
  if (!impl_->alive) {
    observe::after_destroy(kind, &site);
    throw CommError(w->who + ": " + w->what +
                    " after destroy_process_group(): the process group is closed. "
                    "destroy_process_group() must be the last kit call of the program");
  }
  stats_.calls[kind] += 1;
  stats_.bytes[kind] += op.tensor.numel() * op.tensor.element_size();
  observe::p2p(seq, kind, peer, op.tag, op.tensor, site, impl_->name);
  if (impl_->debug) {
    // Control traffic, staged through the rank's device as NCCL needs (kit::control's rule).
    std::vector<int64_t> d = {seq, static_cast<int64_t>(site.line),
                              static_cast<int64_t>(op.tensor.scalar_type()), op.tensor.dim(),
                              op.tensor.numel()};
    for (int64_t i = 0; i < kDims; ++i) d.push_back(i < op.tensor.dim() ? op.tensor.size(i) : 0);
    auto mine = torch::tensor(d, torch::kLong).to(device());
    w->p2p->mine = mine;
    if (op.kind == P2POp::kRecv) w->p2p->theirs = torch::empty_like(mine);
  }
  return w;
}

// The backend's own call; the caller holds the group's mutex.
void ProcessGroup::start_p2p(Work::Impl& w, const P2POp& op) {
  auto start = [&](Work::Impl& call, torch::Tensor t, int tag) {
    std::vector<torch::Tensor> list{wire(t, call)};
    try {
      call.work = op.kind == P2POp::kSend ? impl_->backend->send(list, op.peer, tag)
                                          : impl_->backend->recv(list, op.peer, tag);
    } catch (const std::exception& e) {
      throw CommError(explain(e.what(), call));
    }
  };
  if (w.p2p->mine.defined()) {  // KIT_DEBUG_COLLECTIVES: the description goes first
    // Named as the call itself: when the description waits forever, so does the call.
    auto d = std::make_shared<Work::Impl>();
    d->what = w.what;
    d->who = w.who;
    d->timeout_s = w.timeout_s;
    d->group = w.group;
    d->p2p = std::make_shared<Work::Impl::P2P>();
    d->p2p->kind = w.p2p->kind;
    d->p2p->peer = w.p2p->peer;
    d->p2p->traced = false;
    start(*d, op.kind == P2POp::kSend ? w.p2p->mine : w.p2p->theirs, op.tag + kTagLimit);
    w.p2p->description = d;
  }
  // Gloo and NCCL move contiguous memory: a strided tensor travels through a contiguous copy
  // (a receive's copy goes into the tensor in wait(), as the collectives' packed buffers do).
  torch::Tensor t = op.tensor.is_contiguous() ? op.tensor : op.tensor.contiguous();
  if (op.kind == P2POp::kRecv && !t.is_same(op.tensor)) {
    w.flat = t.view({-1});
    w.tensors = {op.tensor};
  }
  start(w, t, op.tag);
}

Work ProcessGroup::isend(torch::Tensor tensor, int peer, int tag, CallSite site) {
  return batch_isend_irecv({{P2POp::kSend, std::move(tensor), peer, tag}}, site);
}

Work ProcessGroup::irecv(torch::Tensor tensor, int peer, int tag, CallSite site) {
  return batch_isend_irecv({{P2POp::kRecv, std::move(tensor), peer, tag}}, site);
}

Work ProcessGroup::batch_isend_irecv(std::vector<P2POp> ops, CallSite site) {
  require_member("batch_isend_irecv", &site);
  if (ops.empty())
    throw CommError(who() + ": batch_isend_irecv (" + site.str() + ") was given no operations");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::shared_ptr<Work::Impl>> parts;
  for (auto& op : ops) parts.push_back(enter_p2p(op, site));
  // NCCL: one group, so that a send and a receive between the same two ranks can both proceed
  // (c10d's coalescing, what torch.distributed.batch_isend_irecv uses). One op needs no group.
  const bool group = backend_ == "nccl" && ops.size() > 1;
  // NCCL's device rule for every op before the group opens: a refusal inside it would leave it open.
  for (size_t i = 0; i < ops.size(); ++i) wire(ops[i].tensor, *parts[i]);
  if (group) compat::start_coalescing(*impl_->backend);
  for (size_t i = 0; i < ops.size(); ++i) start_p2p(*parts[i], ops[i]);
  if (group) {
    auto batch = std::make_shared<Work::Impl>();
    batch->what = "batch_isend_irecv (" + site.str() + ")";
    batch->who = who();
    batch->timeout_s = impl_->timeout.count() / 1000;
    batch->group = impl_;
    try {
      batch->work = compat::end_coalescing(*impl_->backend);
    } catch (const std::exception& e) {
      throw CommError(explain(e.what(), *batch));
    }
    // The group's Work stands for every op of it; each op's own wait then traces it.
    parts.insert(parts.begin(), batch);
  }
  if (parts.size() == 1) return Work(parts[0]);
  auto all = std::make_shared<Work::Impl>();
  all->parts = std::move(parts);
  return Work(all);
}

namespace detail {

void before_p2p_wait(Work::Impl& w) {
  auto& p = *w.p2p;
  if (!p.description) return;
  Work(p.description).wait();
  if (p.kind != ProcessGroup::P2POp::kRecv) return;
  // The number (field 0) and line (1) are not compared: messages on different tags may be
  // received in another order than they were sent.
  auto theirs = p.theirs.cpu(), mine = p.mine.cpu();
  auto at = [](const torch::Tensor& t, int64_t i) { return t[i].item<int64_t>(); };
  bool same = true;
  for (int64_t f = 2; f < kP2pFields; ++f) same = same && at(theirs, f) == at(mine, f);
  if (same) return;
  auto describe = [&](const torch::Tensor& t) {
    std::string shape = "[";
    for (int64_t i = 0; i < std::min(at(t, 3), kDims); ++i)
      shape += (i ? ", " : "") + std::to_string(at(t, 5 + i));
    shape += at(t, 3) > kDims ? ", ...]" : "]";
    return shape + " " + c10::toString(static_cast<c10::ScalarType>(at(t, 2)));
  };
  throw CommError(w.who + ": " + w.what + " expects " + describe(mine) + ", but rank " +
                  std::to_string(p.peer) + "'s send #" + std::to_string(at(theirs, 0)) +
                  " to it (line " + std::to_string(at(theirs, 1)) + ") has " + describe(theirs) +
                  ". A receive must match its send: the same shape and dtype, the same tag, in the "
                  "same order (KIT_DEBUG_COLLECTIVES)");
}

void after_p2p_wait(Work::Impl& w, std::chrono::steady_clock::time_point started) {
  const auto& p = *w.p2p;
  if (!p.traced) return;
  observe::p2p_wait(p.seq, kind_name(p.kind), p.peer, p.group, started,
                    std::chrono::steady_clock::now());
}

}  // namespace detail

}  // namespace kit
