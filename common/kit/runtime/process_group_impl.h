// kit/runtime/process_group_impl.h — internal to kit/runtime/process_group*.cpp; nothing else includes it.
//
// What the parts of ProcessGroup share: the state behind Work and ProcessGroup (their Impl
// structs), and the two helpers that turn a c10d error into one line. ProcessGroup is defined in
// three files, each one concern:
//   process_group.cpp         the collectives: each one's argument checks and its c10d call, and
//                             Work::wait() with its error in words;
//   process_group_checks.cpp  what every collective passes through first: its number, trace and
//                             byte count, NCCL's device rule, KIT_DEBUG_COLLECTIVES's comparison;
//   process_group_make.cpp    making a group over Gloo or NCCL with its timeout, and shutting it down;
//   process_group_p2p.cpp     send and receive between two ranks: their numbering per peer, trace,
//                             batches and KIT_DEBUG_COLLECTIVES's description ahead of each message.
// kit::control, which uses only the public face, is in control.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kit/compat.h"
#include "kit/runtime/process_group.h"

namespace kit {

// What one rank is doing: the call whose wait is in progress and the last one that finished
// ("send #2 to rank 1 (train.cpp:80)"). Shared by a world and its subgroups; when a wait times
// out the rank publishes it for its peers' error lines (detail::hang_report).
struct Activity {
  std::mutex mutex;
  std::string waiting, last;
};

struct Work::Impl {
  compat::WorkPtr work;
  // The group that started it (for a timeout's report: its activity, store and members).
  std::shared_ptr<ProcessGroup::Impl> group;
  std::vector<torch::Tensor> tensors;
  torch::Tensor flat;    // defined: `tensors` travel packed in this one buffer (see all_reduce_async)
  torch::Tensor gathered, gather_into;  // all_gather through a list: copy the list into the output
  std::vector<torch::Tensor> gather_list;
  // For the error message: which call this is.
  std::string what;      // "all_reduce #3 (train.cpp:56)"
  std::string who;       // "rank 1", or "rank 3 in group 2,3" (ProcessGroup::who())
  int64_t timeout_s = 0;
  // A batch (batch_isend_irecv on Gloo): wait() waits for each part, in order.
  std::vector<std::shared_ptr<Work::Impl>> parts;
  // A send or receive (process_group_p2p.cpp): what its wait() traces, and under
  // KIT_DEBUG_COLLECTIVES the description the sender sent ahead, compared by the receiver.
  struct P2P {
    int kind = 0;        // ProcessGroup::P2POp::Kind
    int peer = -1;       // the peer's world rank
    int64_t seq = 0;     // its number for this peer and direction
    std::string group;   // ProcessGroup::name()
    bool traced = true;  // false: a description's, whose wait is the call's own business
    std::shared_ptr<Work::Impl> description;  // the description's own send or receive
    torch::Tensor theirs, mine;               // the receiver's: the sender's and its own
  };
  std::shared_ptr<P2P> p2p;
};

struct ProcessGroup::Impl {
  compat::BackendPtr backend;
  c10::intrusive_ptr<c10d::Store> store;  // kept alive as long as the group
  std::chrono::milliseconds timeout{0};
  bool alive = true;
  bool debug = false;  // KIT_DEBUG_COLLECTIVES=1: compare every call across ranks first
  bool fake_device = false;  // KIT_DEVICE_CHECK=nccl: tensors live on fakegpu, Gloo gets aliases
  std::mutex mutex;    // DDP's hooks start collectives from autograd's threads

  // Where the group sits in its world (ProcessGroup's constructor fills them in for a world):
  std::shared_ptr<const int> world;  // one object per world, shared by all its groups: its identity
  std::vector<int> ranks;            // the members' world ranks, in group-rank order
  int world_rank = -1;               // this rank's number in the world
  std::string name;                  // "world", or the members' world ranks "0,2"
  int64_t groups_made = 0;           // new_group() calls so far: numbers the next one's store keys
  // This rank's activity and the world's store, shared with every subgroup: a rank whose wait
  // timed out writes what it was doing there as "kit/hang/<world rank>", and reads its peers'.
  std::shared_ptr<Activity> activity;
  c10::intrusive_ptr<c10d::Store> reports;
  std::vector<std::weak_ptr<ProcessGroup>> subgroups;  // closed by shutdown() with this group
};

namespace detail {
// c10d errors are long, multi-line and full of source paths; keep the first line.
std::string first_line(const std::string& what);
// What a failed collective most likely means, in words a student can act on (process_group.cpp).
std::string explain(const std::string& error, const Work::Impl& w);
// A send's or receive's wait (process_group_p2p.cpp): before it, under KIT_DEBUG_COLLECTIVES, the
// receiver compares the sender's description with its own; after it, the trace of the wait
// (`started`: when wait() began).
void before_p2p_wait(Work::Impl& w);
void after_p2p_wait(Work::Impl& w, std::chrono::steady_clock::time_point started);
// A failed wait (process_group.cpp): publishes what this rank was waiting in and whether the wait
// timed out, then waits a little (3 s after a timeout, 1 s after a closed connection, at most the
// group's timeout) for the reports of the ranks it waits for (a send's or receive's peer; a
// collective's other members) and returns them in words: "; rank 1 was waiting in send #1 to
// rank 0 (train.cpp:80)", "" when none came. *heard_timeout: a peer's wait timed out.
std::string hang_report(const Work::Impl& w, bool timed_out, bool* heard_timeout);
}  // namespace detail

}  // namespace kit
