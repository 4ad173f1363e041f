// kit/runtime/process_group.h — ProcessGroup: a communicator (Gloo on CPU, NCCL on GPU) with the
// collectives the kit needs, Work (the handle of one running in the background), CallSite (where
// in the trainer a collective was called) and CommStats (what went over the wire).
//
// This is a thin, version-independent face on c10d: kit/compat.h hides what differs between
// LibTorch versions and backends. Trainers use the free functions of kit/runtime/distributed.h,
// which call the default group that setup() made (the world) unless given another; tests build
// several groups inside one process (local_groups()).
//
// Subgroups, as torch.distributed.new_group: group.new_group(ranks) makes a group of some of the
// group's ranks (tensor, pipeline or data parallelism each run their collectives in groups of
// their own). Every rank of the parent calls it, in the same order; a rank outside `ranks` gets a
// handle that says so (is_member() false), whose collectives are errors. A group knows its
// members' ranks in the world (ranks(), global_rank(), group_rank()).
//
// Every collective is traced (kit/check/observe.h) with its number in this group's sequence, its
// kind, its tensor's shape and dtype and the line of the trainer that called it, so that `kit
// check` can compare the ranks' sequences when a run hangs: every rank must call every collective,
// in the same order, with the same shapes.
//
// NCCL moves only tensors on the rank's GPU. Every tensor handed to the backend passes one check
// of that rule (on NCCL, and on Gloo under KIT_DEVICE_CHECK=nccl, kit/runtime/device_check.h), and
// host values travel only through kit::control (below), which stages them through device().
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/types.h>

namespace kit {

enum class ReduceOp { SUM, AVG, MAX, MIN };
const char* to_string(ReduceOp op);

// Where a collective was called from. Functions take it as a defaulted last argument, and the
// compiler fills in the caller's file and line (as C++20's std::source_location, which Clang 14
// cannot do with GCC's standard library).
struct CallSite {
  const char* file;
  int line;
  CallSite(const char* f = __builtin_FILE(), int l = __builtin_LINE()) : file(f), line(l) {}
  std::string str() const;  // "train.cpp:56"
};

// Thrown when a collective fails: a peer died, it timed out, the shapes of the ranks differ, or
// it was called after destroy_process_group(). what() is one line naming the collective.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A collective in flight. wait() blocks until it is done and rethrows its error as CommError.
class Work {
 public:
  struct Impl;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait();
 private:
  std::shared_ptr<Impl> impl_;
};

// Bytes this rank handed to each kind of collective (the tensors' sizes, not what the algorithm
// sends on the wire), and how many calls: for reports such as exercise 03's communication table.
struct CommStats {
  std::map<std::string, int64_t> calls, bytes;  // by kind: "all_reduce", "all_gather", ...
};

class ProcessGroup {
 public:
  struct Impl;
  ProcessGroup(std::shared_ptr<Impl> impl, int rank, int size, std::string backend);
  ~ProcessGroup();

  // This rank's number in the group, 0..size()-1, and the number of members. -1 and -1 on a rank
  // that is not a member, as torch.distributed.get_rank(group) and get_world_size(group).
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backend() const { return backend_; }  // "gloo" or "nccl"
  // Where this rank's collectives take their tensors: the current GPU on NCCL, fakegpu:0 under
  // KIT_DEVICE_CHECK=nccl (kit/runtime/device_check.h), the CPU on Gloo. Every collective refuses,
  // in one line naming the call, a tensor elsewhere on NCCL and under KIT_DEVICE_CHECK=nccl.
  torch::Device device() const;

  // In-place all-reduce of `tensors` (all of them in one collective).
  Work all_reduce_async(std::vector<torch::Tensor> tensors, ReduceOp op, CallSite site = {});
  void all_reduce(torch::Tensor tensor, ReduceOp op, CallSite site = {}) {
    all_reduce_async({tensor}, op, site).wait();
  }
  // Rank `root`'s tensor, copied into `tensor` on every other rank. `root` is a rank of this
  // group (0..size()-1); kit::broadcast (distributed.h) takes the world's rank, as torch does.
  void broadcast(torch::Tensor tensor, int root, CallSite site = {});
  // output = the inputs of ranks 0..size-1, back to back: output.numel() == size * input.numel()
  // (output may be flat or shaped [size, ...]).
  Work all_gather_async(torch::Tensor output, torch::Tensor input, CallSite site = {});
  void all_gather(torch::Tensor output, torch::Tensor input, CallSite site = {}) {
    all_gather_async(output, input, site).wait();
  }
  // input holds size equal chunks; rank r gets chunk r reduced over all ranks:
  // input.numel() == size * output.numel().
  Work reduce_scatter_async(torch::Tensor output, torch::Tensor input, ReduceOp op,
                            CallSite site = {});
  void reduce_scatter(torch::Tensor output, torch::Tensor input, ReduceOp op, CallSite site = {}) {
    reduce_scatter_async(output, input, op, site).wait();
  }
  // The same, with `input` as scratch (its values are undefined after wait()): on Gloo, where
  // c10d's reduce-scatter all-reduces a copy of the input, the input itself is all-reduced, and no
  // copy of it is made. The same arithmetic and bytes; traced and counted as a reduce_scatter.
  Work reduce_scatter_scratch_async(torch::Tensor output, torch::Tensor input, ReduceOp op,
                                    CallSite site = {});
  void barrier(CallSite site = {});

  // --- Point to point -----------------------------------------------------------------------
  // One rank sends, one receives, as torch.distributed.send/recv/isend/irecv: `peer` is the other
  // rank's number in this group (0..size()-1; the free functions of distributed.h take world
  // ranks, as torch does), `tag` (0 to 2^30 - 1) tells apart messages between the same two ranks
  // on Gloo (NCCL ignores it, as in PyTorch: there the order alone pairs them). The receiver's
  // tensor must have the sender's shape and dtype (a strided one is received through a contiguous
  // copy). isend/irecv return at once; the tensor must not be touched until wait(). send() and
  // recv() wait: a send waits until the peer has posted its receive, on Gloo as on NCCL, so two
  // blocking sends facing each other (each rank sends first, then receives) wait for each other
  // forever. Post one side non-blocking, or both in one batch_isend_irecv.
  // Numbered per peer and direction, not in the group's sequence (only two ranks take part): the
  // trace has "p2p seq=N kind=send peer=R tag=T ..." with R the peer's world rank, and its wait
  // "p2p_wait ..." with its start and end. NCCL's device rule as for the collectives.
  // KIT_DEBUG_COLLECTIVES=1 sends a description ahead of each message (its number, line, dtype
  // and shape) that the receiver compares with its own in wait(): another shape or dtype is one
  // line naming both calls instead of a wrong tensor or a backend error.
  // A wait that times out (Gloo; on NCCL c10d's watchdog aborts the rank) is one line naming the
  // call, its line and the peer, and what the peer was waiting in: each rank whose wait times out,
  // collective or not, leaves that in the world's store (detail::hang_report), so both ranks of a
  // deadlock name each other's call ("rank 1 was waiting in send #1 to rank 0 (train.cpp:80)").
  Work isend(torch::Tensor tensor, int peer, int tag = 0, CallSite site = {});
  Work irecv(torch::Tensor tensor, int peer, int tag = 0, CallSite site = {});
  void send(torch::Tensor tensor, int peer, int tag = 0, CallSite site = {}) {
    isend(tensor, peer, tag, site).wait();
  }
  void recv(torch::Tensor tensor, int peer, int tag = 0, CallSite site = {}) {
    irecv(tensor, peer, tag, site).wait();
  }
  // Several sends and receives started together, as torch.distributed.batch_isend_irecv: on NCCL
  // in one group (ncclGroupStart/End: c10d's coalescing), which NCCL needs when two ranks send to
  // each other at once (1F1B's "send the activation, receive the gradient"), since a lone NCCL send
  // blocks its stream until the peer receives; on Gloo one after the other, as PyTorch does. One
  // Work for all of them.
  struct P2POp {
    enum Kind { kSend, kRecv } kind;
    torch::Tensor tensor;
    int peer;     // in this group (a world rank for kit::batch_isend_irecv of distributed.h)
    int tag = 0;
  };
  Work batch_isend_irecv(std::vector<P2POp> ops, CallSite site = {});

  // After shutdown() every collective throws CommError naming the call: destroy_process_group()
  // calls it, so work after it is one clear error, not a crash on a released connection. The
  // backend's own shutdown() runs too (NCCL: its communicators are finalized and its watchdog
  // stopped, as torch.distributed.destroy_process_group() does).
  void shutdown();
  bool alive() const;

  // --- Subgroups ----------------------------------------------------------------------------
  // A group of some of this group's ranks, as torch.distributed.new_group(ranks): `ranks` are
  // ranks of the world (as everywhere in torch.distributed), each a member of this group, sorted
  // as torch sorts them (group rank i is the i-th smallest). Every rank of this group must call it,
  // in the same order: the groups are numbered by that order (their keys in this group's store),
  // and the members check that they were given the same ranks. A rank not in `ranks` gets a group
  // with is_member() false (PyTorch's GroupMember.NON_GROUP_MEMBER). Creating it is collective
  // among the members (Gloo connects them; NCCL at their first collective). Same backend and
  // timeout as this group; destroy_process_group() closes it with the world.
  // Refused with CommError, one line naming `site`: an empty list, a rank twice, a rank that is
  // not in this group, a call on a group this rank is not a member of, members that were given
  // different lists. (PyTorch accepts an empty list: a group with no members.)
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, CallSite site = {});

  bool is_member() const { return rank_ >= 0; }
  // The members' ranks in the world, in group-rank order (torch.distributed.
  // get_process_group_ranks): 0..size()-1 for a world (setup()'s group, or local_groups()').
  const std::vector<int>& ranks() const;
  int global_rank(int group_rank) const;  // ranks()[group_rank] (get_global_rank); CommError if none
  int group_rank(int global_rank) const;  // its index in ranks() (get_group_rank); -1: not a member
  // How traces and error lines name the group: "world", or its members' world ranks ("0,2").
  const std::string& name() const;
  // Whether both groups come from one world: setup()'s, or one call of local_groups(). Groups of
  // two worlds have nothing in common (their ranks are other processes, or other threads).
  bool same_world(const ProcessGroup& other) const;
  // Throws CommError "rank R: <what> (<site>) on group <name>, which rank R is not a member of
  // ..." unless this rank is a member. Every collective checks it first.
  void require_member(const char* what, const CallSite* site = nullptr) const;

  int64_t collectives() const { return seq_; }  // how many this rank has entered
  const CommStats& stats() const { return stats_; }

  // N groups of one in-process world on a HashStore, one per rank, for tests whose ranks are
  // threads (their subgroups: each rank's thread calls new_group on its own). backend "gloo": CPU tensors. backend "nccl": rank r works on cuda:r (NCCL cannot put
  // two ranks on one GPU), so it needs n visible GPUs and a CUDA build of LibTorch; otherwise it
  // throws CommError with nccl_unavailable(n)'s reason.
  static std::vector<std::shared_ptr<ProcessGroup>> local_groups(
      int n, std::chrono::milliseconds timeout = std::chrono::seconds(30),
      const std::string& backend = "gloo");

  // Whether this process can run `ranks` NCCL ranks, one per GPU: "" when it can, otherwise the
  // reason in one line ("this LibTorch is a CPU build without CUDA/NCCL", "no GPU visible ...",
  // "needs 4 GPUs ..."). Asked at run time, so that GPU tests compile everywhere and skip with
  // the reason where they cannot run.
  static std::string nccl_unavailable(int ranks = 1);
  // Whether this LibTorch was built with CUDA and NCCL (whether or not a GPU is visible).
  static bool nccl_built();

 private:
  // Numbers the call, traces it, counts it; throws if the group is shut down.
  std::shared_ptr<Work::Impl> enter(const char* kind, const torch::Tensor& t, const char* op,
                                    const CallSite& site);
  // The same for one send or receive (its number is per peer and direction), and its start on
  // the backend (with its debug description first, under KIT_DEBUG_COLLECTIVES). In
  // process_group_p2p.cpp.
  std::shared_ptr<Work::Impl> enter_p2p(const P2POp& op, const CallSite& site);
  void start_p2p(Work::Impl& w, const P2POp& op);
  // What the backend is given for `t` in `call`: NCCL's device rule checked (see device()).
  torch::Tensor wire(const torch::Tensor& t, const Work::Impl& call) const;
  // "rank 3" in a world, "rank 3 in group 2,3" in a subgroup: the start of every error line.
  std::string who() const;
  std::shared_ptr<Impl> impl_;
  int rank_, size_;
  std::string backend_;
  int64_t seq_ = 0;
  std::map<std::pair<int, int>, int64_t> p2p_seq_;  // (kSend or kRecv, peer) -> calls so far
  CommStats stats_;
};

// Control traffic: small host values the ranks must agree on (a stop flag, a loss sum, an
// order of buckets, a report of bytes), as opposed to the training's own tensors. Every such
// exchange in the kit goes through these, and nothing else makes a tensor for a collective on the
// host: each call copies the values to group.device(), runs the collective there and returns the
// result on the CPU. That is what torch.distributed does for its object collectives on NCCL, and
// it is right on both backends (on Gloo the copies are no-ops). Values of any device are taken;
// the caller's tensor is never modified. `group`: the world (kit::default_group()) or any group
// this rank is a member of; `root` and the order of all_gather are the group's own rank numbers,
// as for ProcessGroup's collectives.
namespace control {
// Every rank's `values` reduced element-wise with `op`.
torch::Tensor all_reduce(ProcessGroup& group, const torch::Tensor& values, ReduceOp op,
                         CallSite site = {});
// Ranks 0..size-1's `values`, back to back: [size * values.numel()].
torch::Tensor all_gather(ProcessGroup& group, const torch::Tensor& values, CallSite site = {});
// Rank `root`'s `values` on every rank (the same shape and dtype on all of them).
torch::Tensor broadcast(ProcessGroup& group, const torch::Tensor& values, int root,
                        CallSite site = {});
}  // namespace control

}  // namespace kit
