// kit/runtime/process_group.cpp — the collectives of ProcessGroup (see process_group.h): each
// one's argument checks and its call into c10d, and Work::wait(), which turns a failure into one
// line a student can act on.
//
// Apart from the rest of ProcessGroup because this is what a reader looks up when a collective
// misbehaves: what c10d is asked to do for each call. What every call passes through before
// (numbering, trace, NCCL's device rule, the cross-rank comparison) is process_group_checks.cpp;
// making and closing a group is process_group_make.cpp; the shared state, process_group_impl.h.
#include "kit/runtime/process_group.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>
#include <thread>

#include "kit/compat.h"
#include "kit/runtime/process_group_impl.h"

namespace kit {

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

namespace detail {

// c10d errors are long, multi-line and full of source paths; keep the first line.
std::string first_line(const std::string& what) {
  auto end = what.find('\n');
  return what.substr(0, end);
}

// A failed wait's report (see process_group_impl.h). The store is the one the ranks met at; a
// rank writes its key when its wait fails, which ends the rank, so any key found is current.
std::string hang_report(const Work::Impl& w, bool timed_out, bool* heard_timeout) {
  if (heard_timeout) *heard_timeout = false;
  if (!w.group || !w.group->reports || !w.group->activity) return "";
  auto& g = *w.group;
  // First a letter: T, this rank's wait timed out; C, its connection closed under it (a peer
  // gave up, or died). Only a T tells a peer that somebody gave up waiting.
  std::string mine = timed_out ? "T" : "C";
  {
    std::lock_guard<std::mutex> lock(g.activity->mutex);
    mine += "was waiting in " + g.activity->waiting +
           (g.activity->last.empty() ? "" : ", after " + g.activity->last);
  }
  std::vector<int> peers;
  if (w.p2p) peers.push_back(w.p2p->peer);
  else
    for (int r : g.ranks)
      if (r != g.world_rank) peers.push_back(r);
  auto key = [](int rank) { return "kit/hang/" + std::to_string(rank); };
  std::string out;
  try {
    g.reports->set(key(g.world_rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    // The peers time out at about the same time when they wait for this rank too; a peer that
    // does not report is not waiting in a kit call.
    // A closed connection waits less for the reports: its peer may simply have died.
    const auto grace = std::min(g.timeout, std::chrono::milliseconds(timed_out ? 3000 : 1000));
    const auto deadline = std::chrono::steady_clock::now() + grace;
    std::vector<bool> heard(peers.size(), false);
    bool gave_up = false;
    for (size_t left = peers.size(); left > 0;) {
      for (size_t i = 0; i < peers.size(); ++i)
        if (!heard[i] && g.reports->check({key(peers[i])})) {
          const auto b = g.reports->get(key(peers[i]));
          const std::string theirs(b.begin(), b.end());
          gave_up = gave_up || theirs.rfind("T", 0) == 0;
          out += "; rank " + std::to_string(peers[i]) + " " + theirs.substr(1);
          g.reports->add(key(peers[i]) + "/read", 1);
          heard[i] = true;
          --left;
        }
      if (left == 0 || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int64_t heard_from = std::count(heard.begin(), heard.end(), true);
    if (heard_timeout) *heard_timeout = gave_up;
    // The peers that reported wait for this rank too and read its report. The store lives in
    // world rank 0's process and goes with it: rank 0 stays until they have read its report (the
    // others have nothing more to ask of the store).
    const int64_t readers = g.world_rank == 0 ? heard_from : 0;
    while (readers > 0 && g.reports->add(key(g.world_rank) + "/read", 0) < readers &&
           std::chrono::steady_clock::now() < deadline + grace)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const std::exception& e) {
    // The store is gone with rank 0: the line goes without the others' reports, saying why.
    out += "; the other ranks' reports could not be read (" + first_line(e.what()) + ")";
  }
  return out;
}

// What a failed wait() most likely means, in words a student can act on. A timeout, or a
// connection closed under the wait (Gloo closes a rank's connections when one of its waits times
// out, so its peers' waits end at once), asks the peers what they were waiting in (hang_report).
std::string explain(const std::string& error, const Work::Impl& w) {
  std::string lower = error;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string who = w.who + ": " + w.what;
  const std::string after = std::to_string(w.timeout_s) + " s";
  const bool timed_out =
      lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
  const bool closed = lower.find("closed") != std::string::npos ||
                      lower.find("reset by peer") != std::string::npos ||
                      lower.find("broken pipe") != std::string::npos;
  if (!timed_out && !closed) return who + " failed: " + first_line(error);
  bool heard = false;  // a peer's wait timed out: it gave up waiting
  const std::string report = hang_report(w, timed_out, &heard);
  if (w.p2p) {
    const std::string peer = "rank " + std::to_string(w.p2p->peer);
    const char* match = w.p2p->kind == ProcessGroup::P2POp::kSend ? "receive" : "send";
    if (!timed_out && !heard)
      return who + " failed: " + peer + " left the job (it died, or it finished without posting the "
             "matching " + match + "): " + first_line(error);
    return who + (timed_out ? " timed out after " + after : " ended when " + peer + " gave up waiting after " + after) +
           ": " + peer + " never posted the matching " + match + report +
           // Nothing read from the peer. (A report without T is still one: the peer's own wait
           // can end with the connection this rank's timeout closed, before its timeout.)
           (timed_out && report.empty() ? "; " + peer + " reported nothing (it is not waiting in a "
                                          "kit call: still computing, stuck elsewhere, or gone)" : "") +
           ". Every send needs its receive on the peer, with the same tag, in the same order; a "
           "send without its receive, or two blocking sends facing each other, wait forever (post "
           "one side with isend/irecv, or both in one batch_isend_irecv)";
  }
  const std::string advice =
      ". Usually a collective that not every rank calls (one inside `if (rank == 0)`), or ranks "
      "calling collectives in a different order: every rank must call every collective, in the "
      "same order";
  if (timed_out) return who + " timed out after " + after + ": the other ranks never joined it" + report + advice;
  if (heard)
    return who + " failed: another rank left the job (it gave up waiting after " + after + ")" +
           report + advice;
  return who + " failed: another rank left the job (it died, or it finished without calling this "
         "collective): " + first_line(error);
}

}  // namespace detail

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

// reduce_scatter's argument rule, for both its forms (reduce_scatter_async and the scratch one):
// `input` holds world size equal chunks of `output`'s size, in `output`'s dtype.
void check_reduce_scatter(const torch::Tensor& output, const torch::Tensor& input, int world,
                          const CallSite& site) {
  if (input.numel() != world * output.numel() || output.scalar_type() != input.scalar_type())
    throw CommError("reduce_scatter (" + site.str() + "): the input must hold world size (" +
                    std::to_string(world) + ") x the output's " + std::to_string(output.numel()) +
                    " elements of the same dtype, it holds " + std::to_string(input.numel()));
}

}  // namespace

using detail::explain;

void Work::wait() {
  if (!impl_->parts.empty()) {  // a batch: each of its sends and receives
    for (auto& part : impl_->parts) Work(part).wait();
    return;
  }
  const auto started = std::chrono::steady_clock::now();
  if (impl_->p2p) detail::before_p2p_wait(*impl_);
  Activity* doing = impl_->group ? impl_->group->activity.get() : nullptr;
  if (doing) {  // what this rank's report says if the wait times out (detail::hang_report)
    std::lock_guard<std::mutex> lock(doing->mutex);
    doing->waiting = impl_->what;
  }
  try {
    // A send or receive inside an NCCL group has no Work of its own: the group's stands for it.
    if (impl_->work) impl_->work->wait();
  } catch (const std::exception& e) {
    throw CommError(explain(e.what(), *impl_));
  }
  if (doing) {
    std::lock_guard<std::mutex> lock(doing->mutex);
    doing->last = impl_->what;
  }
  if (impl_->p2p) detail::after_p2p_wait(*impl_, started);
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

Work ProcessGroup::all_reduce_async(std::vector<torch::Tensor> tensors, ReduceOp op,
                                    CallSite site) {
  require_member("all_reduce", &site);
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
  require_member("broadcast", &site);
  if (root < 0 || root >= size_)
    throw CommError(who() + ": broadcast (" + site.str() + "): root " + std::to_string(root) +
                    " is not a rank of " + (name() == "world" ? "the world" : "group " + name()) +
                    " (0 to " + std::to_string(size_ - 1) + ")");
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
  require_member("all_gather", &site);
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
    // Both flat: Gloo compares each rank's part of the output with the input's shape, and a
    // shaped output ([size, n]) has parts [1, n].
    ins[0] = ins[0].view({-1});
    outs[0].push_back(wire(output, *w).view({-1}));
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
  require_member("reduce_scatter", &site);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  check_reduce_scatter(output, input, size_, site);
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
  require_member("reduce_scatter", &site);
  if (backend_ == "nccl" || !input.is_contiguous()) return reduce_scatter_async(output, input, op, site);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  check_reduce_scatter(output, input, size_, site);
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
  require_member("barrier", &site);
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

}  // namespace kit
