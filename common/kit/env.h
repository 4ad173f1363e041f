// kit/env.h — RankEnv and read_rank_env(): who am I in the job? (rank, local rank, world size,
// rendezvous address), read from the launcher's environment. Plain C++, no LibTorch.
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

// "jwb[0012-0015,0020],login1" -> "jwb0012": the first host of a Slurm node list, without
// needing `scontrol show hostnames` (which is not there inside every container).
std::string first_host(const std::string& nodelist);

// The rendezvous port a Slurm job uses when MASTER_PORT is not set: derived from the job id so
// that two jobs sharing a node do not collide, and kept below the Linux ephemeral range
// (32768-60999) so that an outgoing connection cannot already hold it. Same formula as sbatch/.
int port_for_job(long job_id);

}  // namespace kit
