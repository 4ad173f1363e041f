// kit/runtime/process_group_make.cpp — making a ProcessGroup and closing it (see process_group.h):
// over Gloo or NCCL, with its collectives' timeout, for a trainer's process (make_process_group,
// called by setup()) or as n ranks on threads of one process (local_groups, for tests); its
// subgroups (new_group) and where a group sits in its world; whether NCCL can run here at all;
// shutdown().
//
// Apart from the collectives because this is where LibTorch builds and GPUs differ (the
// KIT_HAVE_NCCL parts), and it runs once per group, not once per call.
#include "kit/runtime/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <torch/cuda.h>

#include "kit/compat.h"
#include "kit/runtime/device_check.h"
#include "kit/runtime/process_group_impl.h"

namespace kit {

using detail::first_line;

namespace {
// Returns once every one of the `size` members has made its group on `store` (a counter on the
// store). A Gloo member's group is ready once its own connections are; a member that went on and
// stopped at once (a flag refused right after, on every rank alike) would reset a connection
// another member was still making, whose one line would then be "Connection reset by peer"
// instead of the refusal. PyTorch's init_process_group has this barrier too
// (_store_based_barrier), off by default since 2023 (TORCH_DIST_INIT_BARRIER=1 turns it on)
// because it costs at thousands of ranks.
//
// The barrier alone left one race (CI, badinput PipelineFlags/MoreStagesThanRanks, twice): world
// rank 0 hosts the store, and when it was the last to arrive it left at once, refused the flag
// and ended, while another member had its counter's answer but had not yet asked to wait for
// "all_ready": that member's wait met a closed store. So the host leaves last: every other member
// says it is past the barrier (add() waits for the store's answer, and the member asks nothing
// more here), and the host waits until all of them have. Three store calls a member.
void wait_for_every_member(const c10::intrusive_ptr<c10d::Store>& store, int size,
                           std::chrono::milliseconds timeout, bool hosts_store) {
  if (size <= 1) return;
  if (store->add("members_ready", 1) == size) store->set("all_ready", std::vector<uint8_t>{1});
  store->wait({"all_ready"}, timeout);
  if (!hosts_store) {
    // size - 1 of them when the host is a member; when it is not, nobody waits for "all_past".
    if (store->add("members_past", 1) == size - 1) store->set("all_past", std::vector<uint8_t>{1});
    return;
  }
  store->wait({"all_past"}, timeout);
}

std::string joined(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}
}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl, int rank, int size, std::string backend)
    : impl_(std::move(impl)), rank_(rank), size_(size), backend_(std::move(backend)) {
  const char* debug = std::getenv("KIT_DEBUG_COLLECTIVES");
  impl_->debug = debug && std::strcmp(debug, "1") == 0 && size_ > 1;
  impl_->fake_device = backend_ == "gloo" && device_check::enabled();
  if (impl_->ranks.empty()) {  // a world (new_group() fills these in for a subgroup)
    for (int r = 0; r < size_; ++r) impl_->ranks.push_back(r);
    impl_->world_rank = rank_;
    impl_->name = "world";
  }
  if (!impl_->world) impl_->world = std::make_shared<const int>(size_);
  if (!impl_->activity) impl_->activity = std::make_shared<Activity>();  // a world's: its own
  if (!impl_->reports) impl_->reports = impl_->store;
  if (impl_->name.empty()) impl_->name = joined(impl_->ranks);
}

ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::alive() const { return impl_->alive; }

void ProcessGroup::shutdown() {
  std::vector<std::shared_ptr<ProcessGroup>> subgroups;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->alive = false;
    if (impl_->backend) compat::shutdown_backend(*impl_->backend);
    impl_->backend.reset();
    for (auto& weak : impl_->subgroups)
      if (auto g = weak.lock()) subgroups.push_back(g);
  }
  // As torch.distributed.destroy_process_group(): every group goes with the world.
  for (auto& g : subgroups) g->shutdown();
}

const std::vector<int>& ProcessGroup::ranks() const { return impl_->ranks; }
const std::string& ProcessGroup::name() const { return impl_->name; }
bool ProcessGroup::same_world(const ProcessGroup& other) const {
  return impl_->world == other.impl_->world;
}

int ProcessGroup::global_rank(int group_rank) const {
  if (group_rank < 0 || group_rank >= static_cast<int>(impl_->ranks.size()))
    throw CommError(who() + ": global_rank(" + std::to_string(group_rank) + "): group " + name() +
                    " has ranks 0 to " + std::to_string(impl_->ranks.size() - 1));
  return impl_->ranks[group_rank];
}

int ProcessGroup::group_rank(int global_rank) const {
  auto at = std::find(impl_->ranks.begin(), impl_->ranks.end(), global_rank);
  return at == impl_->ranks.end() ? -1 : static_cast<int>(at - impl_->ranks.begin());
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks, CallSite site) {
  const std::string call = who() + ": new_group (" + site.str() + ")";
  require_member("new_group", &site);
  if (!alive())
    throw CommError(call + " after destroy_process_group(): the process group is closed");
  if (ranks.empty()) throw CommError(call + " was given no ranks: a group needs members");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (group_rank(ranks[i]) < 0)
      throw CommError(call + " was given rank " + std::to_string(ranks[i]) + ", which is not in " +
                      (name() == "world" ? "the world (ranks 0 to " + std::to_string(size_ - 1) + ")"
                                         : "its parent, group " + name()));
    if (i > 0 && ranks[i] == ranks[i - 1])
      throw CommError(call + " was given rank " + std::to_string(ranks[i]) + " twice");
  }
  // Every rank of this group counts the calls, members or not: the n-th call's keys live under
  // "group<n>/" in this group's store, so the members of one call meet and no other call's do.
  const int64_t number = ++impl_->groups_made;
  auto sub = std::make_shared<Impl>();
  sub->timeout = impl_->timeout;
  sub->world = impl_->world;
  sub->world_rank = impl_->world_rank;
  sub->ranks = ranks;
  sub->activity = impl_->activity;
  sub->reports = impl_->reports;
  const auto mine = std::find(ranks.begin(), ranks.end(), impl_->world_rank);
  if (mine == ranks.end()) return std::make_shared<ProcessGroup>(sub, -1, -1, backend_);
  const int rank = static_cast<int>(mine - ranks.begin()), size = static_cast<int>(ranks.size());
  sub->store = c10::make_intrusive<c10d::PrefixStore>("group" + std::to_string(number), impl_->store);
  // The first member to arrive writes its list; a member with another list was given other ranks
  // for the same call (or made its groups in another order), and would wait on the wrong peers.
  const std::string list = joined(ranks);
  const std::vector<uint8_t> agreed = sub->store->compareSet(
      "ranks", std::vector<uint8_t>(), std::vector<uint8_t>(list.begin(), list.end()));
  if (std::string(agreed.begin(), agreed.end()) != list)
    throw CommError(call + " was given ranks " + list + ", another member of its group " +
                    std::string(agreed.begin(), agreed.end()) + ": every rank of " +
                    (name() == "world" ? "the world" : "group " + name()) +
                    " must make the same groups, in the same order");
  try {
#if defined(KIT_HAVE_NCCL)
    if (backend_ == "nccl") sub->backend = compat::make_nccl(sub->store, rank, size, sub->timeout);
#endif
    if (backend_ == "gloo") sub->backend = compat::make_gloo(sub->store, rank, size, sub->timeout);
    wait_for_every_member(sub->store, size, sub->timeout, impl_->world_rank == 0);
  } catch (const std::exception& e) {
    throw CommError(call + " could not make its " + backend_ + " group " + list + ": " +
                    first_line(e.what()));
  }
  auto group = std::make_shared<ProcessGroup>(sub, rank, size, backend_);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->subgroups.push_back(group);
  return group;
}

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
  const auto world = std::make_shared<const int>(n);  // one world: its groups are same_world()
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
        impl->world = world;
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
  // Rank 0 hosts the world's TCPStore (runtime/distributed.cpp, rendezvous).
  wait_for_every_member(store, size, timeout, rank == 0);
  return std::make_shared<ProcessGroup>(impl, rank, size, backend);
}

}  // namespace kit
