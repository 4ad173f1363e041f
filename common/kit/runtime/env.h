// kit/runtime/env.h — RankEnv and read_rank_env(): who am I in the job? (rank, local rank, world
// size, rendezvous address), read from the launcher's environment. Plain C++, no LibTorch.
//
// Two launchers are understood:
//   * ddprun / torchrun style: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
//   * a plain `srun`: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, and the first host of
//     SLURM_JOB_NODELIST as the rendezvous host (MASTER_ADDR/MASTER_PORT still win if set).
// Neither present means a single process: rank 0 of a world of 1.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kit {

// Thrown for every setup problem. what() is one line that says what is wrong and what to do.
struct SetupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RankEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;     // ranks on this node; used to split the CPU cores
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          // 0: single process, no rendezvous needed
  std::string launcher = "none";  // "env" (ddprun/torchrun), "slurm" or "none"
};

// The environment as a lookup function, so tests can pass a map instead of the real environ.
using EnvLookup = std::function<const char*(const char*)>;

// Reads the variables above. Throws SetupError on a partial or inconsistent environment
// (e.g. RANK set but WORLD_SIZE not, RANK >= WORLD_SIZE, a port that is not a number).
RankEnv read_rank_env(const EnvLookup& getenv);
RankEnv read_rank_env();  // from the real environment

// The device this rank drives, chosen among the GPUs this rank can see (visible_gpus; "cpu" when
// none): one visible GPU is the rank's own ("cuda:0": --gpus-per-task=1, a --gpu-bind that gives
// each task one GPU); at least as many visible as the node's ranks: "cuda:<local_rank>" (--gres,
// --gpus-per-node: every task sees all of them). Anything else is a SetupError naming the Slurm
// flags to use. visible_devices (CUDA_VISIBLE_DEVICES as this rank sees it, nullptr if unset)
// only goes into that message.
std::string device_for(const RankEnv& env, int visible_gpus, const char* visible_devices);

// What device_for() cannot see from one rank: two ranks driving one GPU (more ranks than GPUs:
// ddprun --nproc-per-node 4 on a node of one, or --gres=gpu:1 with four tasks, where every rank
// sees "its" cuda:0). gpu_of_rank[r] is rank r's node and GPU as "<host> <PCI address>" ("" for
// a rank on the CPU); setup() gathers them from every rank. Returns the first two ranks that
// share one as one line naming them and what to do, or "" when every GPU has one rank.
std::string shared_gpu(const std::vector<std::string>& gpu_of_rank);

// A rank that sees no GPU although Slurm gave the job GPUs on its node (SLURM_GPUS_ON_NODE,
// SLURM_STEP_GPUS or SLURM_JOB_GPUS set and not empty): a binding that left this task none (a
// --gpu-bind map with fewer entries than tasks, CUDA_VISIBLE_DEVICES cleared by the script).
// Training on the CPU there would be silent and slow: one line saying which flags to use, or ""
// when the rank sees a GPU or Slurm gave none. Only asked in a CUDA build; setup() lets
// KIT_ALLOW_CPU=1 (cpu_run_allowed, below) pass it: a CPU run that is meant.
std::string gpus_given_but_unseen(const EnvLookup& getenv, int visible_gpus);

// A program built against a CPU-only LibTorch that starts inside a Slurm job (SLURM_JOB_ID set)
// with GPUs on this node: Slurm says so (SLURM_STEP_GPUS, SLURM_JOB_GPUS or SLURM_GPUS_ON_NODE set
// and not 0), or the NVIDIA driver lists GPUs (driver_gpus > 0: a site that hands out whole GPU
// nodes without a GRES). It would train on the CPU while the job's GPUs idle, and nothing would say
// so. Returns one line saying that the build has no CUDA and which module to load (the site
// profile's KIT_MODULES when exported, sbatch/sites/), or "" where that is not the case or a CPU
// run is allowed: KIT_ALLOW_CPU=1 (set by every kit program's --allow-cpu flag, kit/train/args.h).
// Only asked in a CPU build: a CUDA build's own case is gpus_given_but_unseen().
std::string cpu_build_in_gpu_job(const EnvLookup& getenv, int driver_gpus);

// The GPUs the NVIDIA driver lists on this machine (the entries of /proc/driver/nvidia/gpus/),
// without CUDA: what a CPU build can know. 0 without the driver.
int driver_gpus();

// KIT_ALLOW_CPU=1: a CPU run inside a GPU job is what the user wants (exercise checks in an
// allocation too small for their ranks, a test cluster with fake GPUs). Anything else but unset,
// "" or "0" is a SetupError, so that a typo does not silently mean "no".
bool cpu_run_allowed(const EnvLookup& getenv);

// "jwb[0012-0015,0020],login1" -> "jwb0012": the first host of a Slurm node list, without
// needing `scontrol show hostnames` (which is not there inside every container).
std::string first_host(const std::string& nodelist);

// The rendezvous port a Slurm job uses when MASTER_PORT is not set: derived from the job id so
// that two jobs sharing a node do not collide, and kept below the Linux ephemeral range
// (32768-60999) so that an outgoing connection cannot already hold it. Same formula as sbatch/.
int port_for_job(long job_id);

}  // namespace kit
