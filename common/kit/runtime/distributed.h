// kit/runtime/distributed.h — setup(), all_reduce(), print0(), save0(), new_group(),
// destroy_process_group(): the torch.distributed calls a trainer needs, which LibTorch's C++
// frontend does not have.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "kit/runtime/process_group.h"

namespace kit {

// What a rank needs to know about itself. Read its fields by name:
//   const kit::Setup me = kit::setup(seed);
//   ... me.rank, me.local_rank, me.world_size, me.device ...
// It cannot be unpacked by position: `auto [a, b, c, d] = kit::setup()` does not compile. Two of
// the fields are ints next to each other (local_rank and rank), so a positional unpacking in the
// wrong order would compile and run with the two swapped, silently while they agree (a job on one
// node) and with the wrong GPU or data slice elsewhere. A class with a private data member cannot
// be decomposed by structured bindings (C++17 [dcl.struct.bind]/4), hence by_name_only_.
// (tests/unit: SetupCannotBeUnpackedByPosition compiles such a line and expects it to fail.)
struct Setup {
  Setup(int local_rank, int rank, torch::Device device, int world_size)
      : local_rank(local_rank), rank(rank), device(device), world_size(world_size) {}
  int local_rank;       // index among the ranks on this node -> which GPU this rank drives
  int rank;             // index among all ranks of the job, 0..world_size-1
  torch::Device device; // cuda:local_rank on a GPU node, cpu otherwise
  int world_size;       // number of ranks in the job

 private:
  bool by_name_only_ __attribute__((unused)) = true;  // see above: no structured bindings
};

// Joins the job. Reads the rank environment (kit/runtime/env.h), makes the rank's GPU current
// (device_for(), env.h), meets the other ranks at MASTER_ADDR:MASTER_PORT (rank 0 listens;
// everybody checks in, with a "k of N joined" timeout), creates the process group (NCCL when
// CUDA is available, Gloo otherwise), seeds torch's RNG with seed + rank, and sets the intra-op thread count to this rank's share of
// the cores. Without a launcher it sets up a world of one, so the same trainer runs anywhere.
// Any problem is a kit::SetupError with a one-line message.
// Collectives time out after KIT_TIMEOUT seconds (default: c10d's, 10 min for NCCL, 30 min for
// Gloo); the rendezvous after KIT_TIMEOUT too (default 5 min).
Setup setup(uint64_t seed = 0);

bool is_initialized();  // between setup() and destroy_process_group()
int get_rank();        // 0 when not initialized
int get_world_size();  // 1 when not initialized
ProcessGroup& default_group();  // the group setup() created: the world
std::shared_ptr<ProcessGroup> default_group_ptr();  // the same, for objects that outlive a call

// Which group a call works on, as torch.distributed's `group=` argument: a ProcessGroup (by
// reference, pointer or shared_ptr), or nothing (or a null pointer): the world of setup().
class GroupRef {
 public:
  GroupRef() = default;
  GroupRef(std::nullptr_t) {}
  GroupRef(ProcessGroup& group) : group_(&group) {}
  GroupRef(ProcessGroup* group) : group_(group) {}
  GroupRef(const std::shared_ptr<ProcessGroup>& group) : group_(group.get()) {}
  ProcessGroup* get() const { return group_; }  // nullptr: the world
 private:
  ProcessGroup* group_ = nullptr;
};

// A subgroup of the world, or of `parent`, as torch.distributed.new_group(ranks): `ranks` are
// world ranks. Every rank of the parent calls it, in the same order, members or not; a rank
// outside `ranks` gets a group whose is_member() is false (ProcessGroup::new_group says the rest).
// Pass the result to any collective below, to kit::control, DistributedDataParallel's
// Options::group or ZeroOptions::group. E.g. two groups of two on four ranks:
//   auto pair = kit::new_group({0, 1});   // every rank calls both, in this order
//   auto other = kit::new_group({2, 3});
//   auto& mine = pair->is_member() ? pair : other;
//   kit::all_reduce(x, kit::ReduceOp::SUM, mine);  // sums over this rank's pair only
std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, GroupRef parent = {},
                                        CallSite site = {});

// The group an object works on (DistributedDataParallel, ZeroOptimizer, FullyShardedModel):
// `group`, or the world of setup() when it is null. A group this rank is not a member of, or, after
// setup(), a group of another world (one of ProcessGroup::local_groups()), is a CommError naming
// `what` and `site`. The pointer keeps the world alive (closed, not freed, after
// destroy_process_group()); a given group it only points at.
std::shared_ptr<ProcessGroup> group_or_world(ProcessGroup* group, const char* what,
                                             const CallSite* site = nullptr);

// The collectives, over the world unless `group` names another. Every rank of the group must call
// each of them, in the same order, with tensors of the same shape and dtype: they meet by their
// position in that order, not by name. A rank that skips one leaves the others waiting until
// KIT_TIMEOUT; with KIT_DEBUG_COLLECTIVES=1 the ranks compare every call first and name the one
// that differs. A group this rank is not a member of, or of another world, is an error naming the
// call (PyTorch skips the call with a warning on a non-member).
//
// In place: every rank ends with the reduction of all ranks' tensors, e.g. the average loss:
//   kit::all_reduce(loss, kit::ReduceOp::AVG);
void all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::SUM, GroupRef group = {},
                CallSite site = {});
// Rank `root`'s values, copied into `tensor` on every rank of the group. `root` is the sender's
// rank in the world, as torch.distributed.broadcast's `src`, whatever the group (group rank k is
// group->global_rank(k)); a root outside the group is an error.
void broadcast(torch::Tensor& tensor, int root = 0, GroupRef group = {}, CallSite site = {});
// Every rank's `input`, in group-rank order: output.numel() == group size x input.numel().
void all_gather(torch::Tensor& output, const torch::Tensor& input, GroupRef group = {},
                CallSite site = {});
// `input` is group size equal chunks; group rank r gets chunk r, reduced over the group.
void reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                    ReduceOp op = ReduceOp::SUM, GroupRef group = {}, CallSite site = {});
// Returns once every rank of the group has called it.
void barrier(GroupRef group = {}, CallSite site = {});
void barrier(CallSite site);  // the world's, for a caller that passes its own caller's line on

// Point to point, as torch.distributed.send/recv/isend/irecv/batch_isend_irecv: `dst` and `src`
// (and each op's `peer`) are world ranks, as torch's, whatever the group (ProcessGroup's own
// methods take the group's rank numbers). Unlike a collective only the two ranks take part, and
// each send needs its receive on the peer, with the same shape, dtype and tag, in the same order
// (ProcessGroup::isend says the rest: waits, batches, NCCL). The trace numbers them per peer and
// direction, not in the group's sequence. A peer outside the group, this rank itself or a tag
// outside 0 to 2^30 - 1 is one line naming the call; a send without its receive, or two blocking
// sends facing each other, end after KIT_TIMEOUT with one line on each rank naming its call and
// what its peer was waiting in.
//   kit::send(activation, next_rank);              // waits until next_rank received it
//   kit::recv(buffer, previous_rank);              // buffer: the sender's shape and dtype
void send(const torch::Tensor& tensor, int dst, GroupRef group = {}, int tag = 0, CallSite site = {});
void recv(torch::Tensor& tensor, int src, GroupRef group = {}, int tag = 0, CallSite site = {});
Work isend(const torch::Tensor& tensor, int dst, GroupRef group = {}, int tag = 0, CallSite site = {});
Work irecv(torch::Tensor& tensor, int src, GroupRef group = {}, int tag = 0, CallSite site = {});
// Several at once, one Work for all (on NCCL in one group: what two ranks sending to each other
// at once need). Each op's peer is a world rank.
Work batch_isend_irecv(std::vector<ProcessGroup::P2POp> ops, GroupRef group = {}, CallSite site = {});

// printf() on rank 0 only, so the job's output has each line once instead of world_size times.
void print0(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Saves the module's parameters and buffers like torch::save, on rank 0 only; the other ranks
// wait until the file is complete. The file is written to a temporary name, flushed and renamed,
// so a crash mid-save never leaves a half-written checkpoint under the real name.
void save0(const std::shared_ptr<torch::nn::Module>& module, const std::string& path,
           CallSite site = {});
template <typename M>
void save0(const torch::nn::ModuleHolder<M>& module, const std::string& path, CallSite site = {}) {
  save0(std::static_pointer_cast<torch::nn::Module>(module.ptr()), path, site);
}

// Leaves the job: closes the process group and its connections, and every group new_group()
// made from it. Call once, at the very end: any collective, print0, save0 or DDP step after it is
// an error that says so.
void destroy_process_group();

}  // namespace kit
