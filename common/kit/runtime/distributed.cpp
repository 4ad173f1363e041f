// kit/runtime/distributed.cpp — setup, rendezvous and the rank-0 helpers (see distributed.h).
#include "kit/runtime/distributed.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <thread>

#include <c10/util/Logging.h>  // FLAGS_caffe2_log_level
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include "kit/compat.h"
#include "kit/runtime/device_check.h"
#include "kit/runtime/env.h"
#include "kit/runtime/files.h"
#include "kit/runtime/process.h"
#include "kit/check/observe.h"

namespace kit {
namespace {

std::shared_ptr<ProcessGroup> g_group;  // the default group; empty before setup()/after destroy
int g_rank = 0;

// KIT_TIMEOUT in seconds, or 0 when unset. Not a positive whole number: one error line (a typo
// that silently meant "the default" would turn a hang of seconds into one of half an hour).
int kit_timeout_seconds() {
  const char* t = std::getenv("KIT_TIMEOUT");
  if (t == nullptr || *t == '\0') return 0;
  std::string s = t;
  bool digits = s.size() < 8;
  for (char c : s) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  int seconds = digits ? std::atoi(s.c_str()) : 0;
  if (seconds <= 0)
    throw SetupError("KIT_TIMEOUT='" + s + "' is not a whole number of seconds above 0");
  return seconds;
}

// How long a collective may wait for the other ranks: KIT_TIMEOUT, else c10d's own default for
// the backend, as torch.distributed has it (torch 2.13: kProcessGroupNCCLDefaultTimeout, 10 min,
// in ProcessGroupNCCL.hpp; kBackendDefaultTimeout, 30 min, for Gloo in Backend.hpp). A real step
// may legitimately wait minutes (rank 0 writing a checkpoint, a slow first batch): a shorter
// default would kill healthy jobs. Tests and ./kit check set KIT_TIMEOUT to seconds.
std::chrono::milliseconds collective_timeout(const std::string& backend) {
  if (int s = kit_timeout_seconds(); s > 0) return std::chrono::seconds(s);
  return backend == "nccl" ? std::chrono::minutes(10) : std::chrono::minutes(30);
}

// How long rank 0 waits for everybody at the rendezvous (and any rank for rank 0): KIT_TIMEOUT,
// else c10d's Store::kDefaultTimeout, 5 min. srun starts the tasks of a step together, but a
// container or a module load can delay some of them by minutes; a rank that never comes is
// named after that wait ("k of N ranks joined (missing: ...)").
std::chrono::milliseconds rendezvous_timeout() {
  if (int s = kit_timeout_seconds(); s > 0) return std::chrono::seconds(s);
  return std::chrono::minutes(5);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// Everybody meets at rank 0's TCPStore. Rank 0 publishes its WORLD_SIZE, every rank compares it
// with its own, announces itself under its rank number, and waits until all N have arrived.
// Any rank that sees a problem writes it under "kit/abort", so the others stop at once with the
// same message instead of waiting for the timeout.
c10::intrusive_ptr<c10d::Store> rendezvous(const RankEnv& env, std::chrono::milliseconds timeout) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    std::string why = first_line(e.what());
    if (env.rank == 0 && why.find("in use") != std::string::npos)
      throw SetupError("MASTER_PORT " + std::to_string(env.master_port) + " on " + env.master_addr +
                       " is already in use (another job or a leftover run?): choose another port");
    if (env.rank == 0)
      throw SetupError("rank 0 cannot listen on " + where + ": " + why);
    throw SetupError("rank " + std::to_string(env.rank) + " cannot reach rank 0 at " + where +
                     " within " + std::to_string(timeout.count() / 1000) +
                     " s (is rank 0 running, is MASTER_ADDR right?): " + why);
  }

  auto fail = [&](const std::string& msg) {
    store->set("kit/abort", bytes(msg));
    throw SetupError(msg);
  };
  auto check_abort = [&] {
    if (store->check({"kit/abort"})) throw SetupError(text(store->get("kit/abort")));
  };

  if (env.rank == 0) store->set("kit/world_size", bytes(std::to_string(env.world_size)));
  int theirs = std::stoi(text(store->get("kit/world_size")));
  if (theirs != env.world_size)
    fail("WORLD_SIZE differs between ranks: rank " + std::to_string(env.rank) + " has " +
         std::to_string(env.world_size) + ", rank 0 has " + std::to_string(theirs));
  if (store->add("kit/rank/" + std::to_string(env.rank), 1) != 1)
    fail("two processes claim RANK " + std::to_string(env.rank) + ": check the launcher");
  store->add("kit/joined", 1);

  auto start = std::chrono::steady_clock::now();
  for (;;) {
    check_abort();
    int64_t joined = store->add("kit/joined", 0);
    if (joined >= env.world_size) break;
    if (std::chrono::steady_clock::now() - start > timeout) {
      std::string missing;
      for (int r = 0, listed = 0; r < env.world_size && listed < 8; ++r)
        if (!store->check({"kit/rank/" + std::to_string(r)})) {
          missing += (listed++ ? ", " : "") + std::to_string(r);
        }
      throw SetupError("rendezvous at " + where + " timed out after " +
                       std::to_string(timeout.count() / 1000) + " s: " + std::to_string(joined) +
                       " of " + std::to_string(env.world_size) + " ranks joined (missing: " +
                       missing + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return store;
}

// This rank's share of the CPU cores: what Slurm gave the task, or the cores we may run on
// divided by the ranks on this node. Without it every rank starts one thread per core and they
// all fight over the same cores.
int intra_op_threads(const RankEnv& env) {
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && std::atoi(omp) > 0)
    return std::atoi(omp);
  if (const char* cpt = std::getenv("SLURM_CPUS_PER_TASK"); cpt && std::atoi(cpt) > 0)
    return std::atoi(cpt);
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                           : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, env.local_world_size));
}

}  // namespace

Setup setup(uint64_t seed) {
  // Process-wide, first (kit/runtime/process.h): an uncaught exception ends the process with one
  // line (on a background thread, NCCL's watchdog included, as an abort), and glibc's malloc
  // keeps freed memory. The flag parser has usually done it already; a second call does nothing.
  prepare_process();
  if (g_group) throw SetupError("setup() was called twice");
  RankEnv env = read_rank_env();

  const EnvLookup lookup = [](const char* v) { return std::getenv(v); };
  // A CPU build in a job with GPUs trains on the CPU in silence: stop (kit/runtime/env.h,
  // cpu_build_in_gpu_job), unless --allow-cpu / KIT_ALLOW_CPU=1 says that is meant.
  if (!compat::kHaveNccl) {
    // (No "rank N: " here: the one line of an uncaught error starts with it, kit/runtime/process.h.)
    if (const std::string why = cpu_build_in_gpu_job(lookup, driver_gpus()); !why.empty())
      throw SetupError(why);
  }
  bool cuda = torch::cuda::is_available();
  const torch::Device device(device_for(env, cuda ? static_cast<int>(torch::cuda::device_count()) : 0,
                                        std::getenv("CUDA_VISIBLE_DEVICES")));
  std::string backend = compat::kHaveNccl && cuda ? "nccl" : "gloo";
  if (const char* b = std::getenv("KIT_BACKEND"); b && *b) {
    backend = b;
    if (backend != "nccl" && backend != "gloo")
      throw SetupError("KIT_BACKEND=" + backend + " is not a backend: use nccl or gloo");
    if (backend == "nccl" && !compat::kHaveNccl)
      throw SetupError("KIT_BACKEND=nccl, but this LibTorch is a CPU build without NCCL: build "
                       "against a CUDA build of torch, or use gloo");
    if (backend == "nccl" && !cuda)
      throw SetupError("KIT_BACKEND=nccl needs a GPU, but none is visible on this node "
                       "(CUDA_VISIBLE_DEVICES, --gres?): use gloo, or run on a GPU node");
  } else if (compat::kHaveNccl && !cuda) {
    // A CUDA build that sees no GPU although Slurm gave the job some here: the binding left this
    // task none. Training on the CPU would be silent and slow (kit/runtime/env.h,
    // gpus_given_but_unseen).
    const std::string why = gpus_given_but_unseen(lookup, 0);
    if (!why.empty() && !cpu_run_allowed(lookup))
      throw SetupError("rank " + std::to_string(env.rank) + ": " + why);
    // Said once, by rank 0: the job runs, but not where the user probably thinks.
    if (env.rank == 0)
      std::fprintf(stderr, "kit: this LibTorch is a CUDA build, but no GPU is visible: training "
                           "on the CPU with Gloo\n");
  }
  const auto timeout = collective_timeout(backend);

  // The rank's GPU is made current before the process group exists, as PyTorch's own
  // DDP examples do (torch.cuda.set_device before init_process_group): whatever the group
  // does on "the current device" before a tensor names one (a CUDA context, a barrier on a device
  // that ProcessGroupNCCL::guessDeviceForRank() guesses) happens on this rank's GPU, not on GPU 0.
#if defined(KIT_HAVE_NCCL)
  if (device.is_cuda()) compat::set_cuda_device(device.index());
#endif

  // KIT_DEVICE_CHECK=nccl (kit/runtime/device_check.h): the trainer's device is fakegpu:0 and the
  // group applies NCCL's device rule on Gloo, so that CPU CI sees a host tensor NCCL would refuse.
  bool check_devices = false;
  try {
    check_devices = device_check::enabled();
  } catch (const std::exception& e) {
    throw SetupError(e.what());
  }
  if (check_devices && backend != "gloo")
    throw SetupError("KIT_DEVICE_CHECK=nccl imitates NCCL on Gloo; on a GPU with NCCL it has "
                     "nothing to check: leave it unset, or set KIT_BACKEND=gloo");
  const torch::Device rank_device = check_devices ? device_check::device() : device;

  c10::intrusive_ptr<c10d::Store> store;
  const int log_level = FLAGS_caffe2_log_level;
  if (env.world_size == 1 && env.master_port == 0)
    store = c10::make_intrusive<c10d::HashStore>();  // alone: nobody to meet
  else {
    // c10d logs its own view of a rendezvous problem to stderr first (several glog lines, e.g.
    // one per address it failed to bind), burying the kit's one-line SetupError. Keep c10d's
    // log quiet unless the user asked for it with TORCH_CPP_LOG_LEVEL.
    if (const char* level = std::getenv("TORCH_CPP_LOG_LEVEL"); level == nullptr || *level == '\0')
      FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 3);  // 3: above c10d's ERROR
    store = rendezvous(env, rendezvous_timeout());
  }
  try {
    g_group = make_process_group(c10::make_intrusive<c10d::PrefixStore>("pg", store), env.rank,
                                 env.world_size, backend, timeout);
  } catch (const std::exception& e) {
    throw SetupError("cannot create the " + backend + " process group: " + first_line(e.what()));
  }
  g_rank = env.rank;
  // From here on c10d's errors are the only word on what went wrong: NCCL's watchdog logs why it
  // aborts a rank (which collective timed out or failed) at ERROR, just before the abort.
  FLAGS_caffe2_log_level = log_level;
  name_rank_on_abort(env.rank);  // a SIGABRT from here on names this rank (process.h)

  // One rank per GPU, checked across the ranks (kit/runtime/env.h, shared_gpu): every rank says
  // which node and GPU it drives, and two ranks on one GPU stop every rank with the same line. Only
  // a CUDA build can have GPUs; the others skip the collective altogether.
  if (compat::kHaveNccl && env.world_size > 1) {
    char mine[160] = {};
    if (device.is_cuda()) {
      char host[96] = {};
      gethostname(host, sizeof host - 1);
      std::snprintf(mine, sizeof mine, "%s %s", host, compat::pci_bus_id(device.index()).c_str());
    }
    auto all = control::all_gather(*g_group, torch::from_blob(mine, {sizeof mine}, torch::kUInt8));
    std::vector<std::string> gpu_of_rank;
    for (int r = 0; r < env.world_size; ++r)
      gpu_of_rank.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * sizeof mine));
    if (const std::string why = shared_gpu(gpu_of_rank); !why.empty()) throw SetupError(why);
  }

  // Different seeds per rank: dropout masks and any other randomness differ between ranks, as
  // they would between different batches on one GPU. (The initial weights come from rank 0 via
  // DistributedDataParallel, and the samplers share one seed on purpose.)
  torch::manual_seed(seed + static_cast<uint64_t>(env.rank));
  int threads = intra_op_threads(env);
  torch::set_num_threads(threads);

  observe::setup(env.rank, env.local_rank, env.world_size, rank_device, backend, timeout, threads,
                 seed, is_initialized);
  return Setup{env.local_rank, env.rank, rank_device, env.world_size};
}

bool is_initialized() { return static_cast<bool>(g_group); }
int get_rank() { return g_group ? g_group->rank() : 0; }
int get_world_size() { return g_group ? g_group->size() : 1; }

namespace {
bool g_destroyed = false;  // destroy_process_group() has run

// site: where the trainer called it (nullptr: unknown, as for print0, whose printf-style
// arguments leave no room for one).
[[noreturn]] void after_destroy(const char* what, const CallSite* site) {
  std::string where = site ? " (" + site->str() + ")" : "";
  observe::after_destroy(what, site);
  throw CommError("rank " + std::to_string(g_rank) + ": " + what + where +
                  " after destroy_process_group(): the process group is closed. "
                  "destroy_process_group() must be the last kit call of the program");
}
}  // namespace

std::shared_ptr<ProcessGroup> default_group_ptr() {
  if (!g_group && g_destroyed) after_destroy("a collective", nullptr);
  if (!g_group) throw SetupError("no process group: call kit::setup() first");
  return g_group;
}
ProcessGroup& default_group() { return *default_group_ptr(); }

namespace {
// A given group must come from this job's world: a group of another world (local_groups()) has
// other peers altogether, and would pair this rank with threads of its own process.
void check_world(const ProcessGroup& group, const char* what, const CallSite* site) {
  if (!g_group || group.same_world(*g_group)) return;
  throw CommError("rank " + std::to_string(g_rank) + ": " + what +
                  (site ? " (" + site->str() + ")" : "") + " was given a group of another world "
                  "(not made from setup()'s group, e.g. one of ProcessGroup::local_groups()): a "
                  "job's groups come from kit::new_group()");
}

ProcessGroup& group_for(const char* what, GroupRef group, const CallSite& site) {
  if (!group.get()) {
    if (!g_group && g_destroyed) after_destroy(what, &site);
    return default_group();
  }
  check_world(*group.get(), what, &site);
  group.get()->require_member(what, &site);
  return *group.get();
}
}  // namespace

std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, GroupRef parent, CallSite site) {
  return group_for("new_group", parent, site).new_group(std::move(ranks), site);
}

std::shared_ptr<ProcessGroup> group_or_world(ProcessGroup* group, const char* what,
                                             const CallSite* site) {
  if (!group) return default_group_ptr();
  check_world(*group, what, site);
  group->require_member(what, site);
  return std::shared_ptr<ProcessGroup>(std::shared_ptr<ProcessGroup>(), group);  // owns nothing
}

void all_reduce(torch::Tensor& tensor, ReduceOp op, GroupRef group, CallSite site) {
  ProcessGroup& g = group_for("all_reduce", group, site);
  // The checker reads what went in and came out (small tensors: a loss, an evaluation's sums).
  const observe::AllReduceInput before = observe::before_all_reduce(tensor);
  g.all_reduce(tensor, op, site);
  observe::all_reduce(before, op, tensor);
}

void broadcast(torch::Tensor& tensor, int root, GroupRef group, CallSite site) {
  ProcessGroup& g = group_for("broadcast", group, site);
  // torch.distributed.broadcast's src is a rank of the world whatever the group; c10d's backend
  // takes the group's own number for it.
  const int from = g.group_rank(root);
  if (from < 0)
    throw CommError("rank " + std::to_string(g.global_rank(g.rank())) + ": broadcast (" +
                    site.str() + "): root " + std::to_string(root) + " is not in " +
                    (g.name() == "world" ? "the world (ranks 0 to " + std::to_string(g.size() - 1) + ")"
                                         : "group " + g.name() + " (root is a world rank, as torch's src)"));
  g.broadcast(tensor, from, site);
}

void all_gather(torch::Tensor& output, const torch::Tensor& input, GroupRef group, CallSite site) {
  group_for("all_gather", group, site).all_gather(output, input, site);
}

void reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op,
                    GroupRef group, CallSite site) {
  group_for("reduce_scatter", group, site).reduce_scatter(output, input, op, site);
}

namespace {
// A world rank's number in `g` for a send or receive: one line naming the call when it is not in
// it, or is this rank (said here in world ranks, as the caller gave it).
int peer_in(ProcessGroup& g, int world_rank, const char* what, const CallSite& site) {
  const int me = g.global_rank(g.rank());
  const std::string call = "rank " + std::to_string(me) + ": " + what + " (" + site.str() + "): peer " +
                           std::to_string(world_rank);
  const int peer = g.group_rank(world_rank);
  if (peer < 0)
    throw CommError(call + " is not in " +
                    (g.name() == "world" ? "the world (ranks 0 to " + std::to_string(g.size() - 1) + ")"
                                         : "group " + g.name() + " (peers are world ranks, as torch's dst and src)"));
  if (world_rank == me)
    throw CommError(call + " is this rank itself: a rank cannot send to or receive from itself "
                    "(torch.distributed refuses it too)");
  return peer;
}
}  // namespace

Work isend(const torch::Tensor& tensor, int dst, GroupRef group, int tag, CallSite site) {
  ProcessGroup& g = group_for("send", group, site);
  return g.isend(tensor, peer_in(g, dst, "send", site), tag, site);
}
Work irecv(torch::Tensor& tensor, int src, GroupRef group, int tag, CallSite site) {
  ProcessGroup& g = group_for("recv", group, site);
  return g.irecv(tensor, peer_in(g, src, "recv", site), tag, site);
}
void send(const torch::Tensor& tensor, int dst, GroupRef group, int tag, CallSite site) {
  isend(tensor, dst, group, tag, site).wait();
}
void recv(torch::Tensor& tensor, int src, GroupRef group, int tag, CallSite site) {
  irecv(tensor, src, group, tag, site).wait();
}
Work batch_isend_irecv(std::vector<ProcessGroup::P2POp> ops, GroupRef group, CallSite site) {
  ProcessGroup& g = group_for("batch_isend_irecv", group, site);
  for (auto& op : ops) op.peer = peer_in(g, op.peer, "batch_isend_irecv", site);
  return g.batch_isend_irecv(std::move(ops), site);
}

void barrier(GroupRef group, CallSite site) { group_for("barrier", group, site).barrier(site); }
void barrier(CallSite site) { barrier(GroupRef(), site); }

void print0(const char* format, ...) {
  if (g_destroyed) after_destroy("print0", nullptr);
  char buffer[4096];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  observe::print0(buffer);
  if (get_rank() != 0) return;
  std::fputs(buffer, stdout);
  std::fflush(stdout);  // a job's output file should show progress as it happens
}

void save0(const std::shared_ptr<torch::nn::Module>& module, const std::string& path,
           CallSite site) {
  if (g_destroyed) after_destroy("save0", &site);
  if (get_rank() == 0) {
    torch::serialize::OutputArchive archive;
    module->save(archive);
    write_atomically(path, archive, "save0");  // temp file, fsync, rename (kit/runtime/files.h)
  }
  // The call only: who really wrote the file is for the file system to say (the checker
  // watches the folder), not for this line.
  observe::save0(path);
  // Nobody reads the file before it is complete (e.g. to evaluate the best model).
  if (is_initialized() && get_world_size() > 1) g_group->barrier(site);
}

void destroy_process_group() {
  if (g_destroyed) after_destroy("a second destroy_process_group()", nullptr);
  observe::destroy();
  // Objects that hold the group (a DistributedDataParallel) see it closed, not freed.
  if (g_group) g_group->shutdown();
  g_group.reset();
  g_destroyed = true;
}

}  // namespace kit
