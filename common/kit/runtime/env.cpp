// kit/runtime/env.cpp — reading the rank environment (see env.h).
#include "kit/runtime/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace kit {
namespace {

// A strict integer parse: "3" -> 3; "", "3x", "-1" -> error naming the variable.
int parse_int(const char* name, const char* text, int lo, int hi) {
  std::string s = text ? text : "";
  bool digits = !s.empty();
  for (char c : s) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  long v = digits && s.size() < 10 ? std::strtol(s.c_str(), nullptr, 10) : -1;
  if (!digits || v < lo || v > hi)
    throw SetupError(std::string(name) + "='" + s + "' is not a whole number in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(v);
}

bool has(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && *v != '\0';
}

}  // namespace

std::string first_host(const std::string& nodelist) {
  // The first entry ends at the first comma that is not inside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  // "jwb[0012-0015,0020]": prefix + the first number of the range, zero padding kept. A name
  // may have several ranges and text after them ("rack[0-3]_blade[07-41]" -> "rack0_blade07",
  // "n[1-2]-ib" -> "n1-ib"): every bracket group contributes its first number.
  std::string host;
  for (size_t i = 0; i < first.size();) {
    if (first[i] != '[') {
      host += first[i++];
      continue;
    }
    size_t close = first.find(']', i);
    std::string range = first.substr(i + 1, close == std::string::npos ? std::string::npos : close - i - 1);
    host += range.substr(0, range.find_first_of(",-"));
    i = close == std::string::npos ? first.size() : close + 1;
  }
  return host;
}

std::string device_for(const RankEnv& env, int visible_gpus, const char* visible_devices) {
  if (visible_gpus <= 0) return "cpu";
  // Slurm decides what a task sees. --gpus-per-task=1, or a --gpu-bind that gives each task the
  // one GPU near its cores, leaves one visible GPU per task: the rank's own, whatever its local
  // rank. --gres=gpu:N or --gpus-per-node=N (binding none) shows every task all N: local rank L
  // takes the L-th. (More visible than ranks is the second case too: one process on a
  // workstation with two GPUs, or ddprun --nproc 2 on a node of four.)
  // (That every rank of a node sees one and the same GPU, --gres=gpu:1 with four tasks, cannot
  // be told from one rank: setup() compares every rank's node and GPU, see shared_gpu().)
  if (visible_gpus == 1) return "cuda:0";
  const int ranks = std::max(env.local_world_size, env.local_rank + 1);
  if (visible_gpus >= ranks) return "cuda:" + std::to_string(env.local_rank);
  // Several GPUs but fewer than the node's ranks (e.g. --gpu-bind=closest: each task sees the
  // GPUs of its socket): which of them is this rank's depends on how the other ranks were bound,
  // which this rank cannot see. Guessing could put two ranks on one GPU: refuse.
  std::string seen = visible_devices ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible_devices + ")" : "";
  throw SetupError("local rank " + std::to_string(env.local_rank) + " of " + std::to_string(ranks) +
                   " ranks on this node sees " + std::to_string(visible_gpus) + " GPUs" + seen +
                   ": give each task one GPU (srun --gpus-per-task=1) or every task all of them "
                   "(--gres=gpu:N or --gpus-per-node=N with --ntasks-per-node=N, and --gpu-bind=none)");
}

std::string shared_gpu(const std::vector<std::string>& gpu_of_rank) {
  for (size_t a = 0; a < gpu_of_rank.size(); ++a) {
    if (gpu_of_rank[a].empty()) continue;
    for (size_t b = a + 1; b < gpu_of_rank.size(); ++b) {
      if (gpu_of_rank[b] != gpu_of_rank[a]) continue;
      const std::string& both = gpu_of_rank[a];
      const size_t space = both.find(' ');
      return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " both drive GPU " +
             both.substr(space + 1) + " on " + both.substr(0, space) +
             ": start at most one rank per GPU (ddprun --nproc-per-node at most the node's GPUs; "
             "in Slurm, --ntasks-per-node equal to the GPUs of --gres=gpu:N, or --gpus-per-task=1)";
    }
  }
  return "";
}

std::string gpus_given_but_unseen(const EnvLookup& env, int visible_gpus) {
  if (visible_gpus > 0) return "";
  for (const char* v : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"}) {
    if (!has(env, v) || std::string(env(v)) == "0") continue;
    const char* value = env(v);
    const char* seen = env("CUDA_VISIBLE_DEVICES");
    return std::string("Slurm gave this job GPUs on this node (") + v + "=" + value +
           ") but this rank sees none (CUDA_VISIBLE_DEVICES=" + (seen ? seen : "unset") +
           "): give every task a GPU (srun --gpus-per-task=1, or --gres=gpu:N with "
           "--ntasks-per-node=N and --gpu-bind=none), and leave CUDA_VISIBLE_DEVICES to Slurm";
  }
  return "";
}

bool cpu_run_allowed(const EnvLookup& env) {
  const char* v = env("KIT_ALLOW_CPU");
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw SetupError(std::string("KIT_ALLOW_CPU='") + v + "' is not 0 or 1");
}

std::string cpu_build_in_gpu_job(const EnvLookup& env, int gpus_of_driver) {
  if (!has(env, "SLURM_JOB_ID") || cpu_run_allowed(env)) return "";
  std::string evidence;
  for (const char* v : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"}) {
    if (has(env, v) && std::string(env(v)) != "0") {
      evidence = std::string(v) + "=" + env(v);
      break;
    }
  }
  if (evidence.empty() && gpus_of_driver > 0)
    evidence = "the NVIDIA driver lists " + std::to_string(gpus_of_driver) + " GPU(s) here";
  if (evidence.empty()) return "";
  // The module to load: the site profile's list where the profile exported it (sbatch/sites/).
  const std::string module = has(env, "KIT_MODULES")
                                 ? std::string("'module load ") + env("KIT_MODULES") + "'"
                                 : "your site's PyTorch module ('module spider PyTorch')";
  return "this program was built against a CPU-only LibTorch, but it runs in a Slurm job with "
         "GPUs (" + evidence + "): it would train on the CPU while the GPUs idle; load " + module +
         ", rebuild in a new build folder (./kit build takes the torch that python3 imports), "
         "or allow a CPU run with --allow-cpu (KIT_ALLOW_CPU=1)";
}

int driver_gpus() {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end; !ec && it != end;
       it.increment(ec))
    ++n;
  return n;
}

int port_for_job(long job_id) { return 20000 + static_cast<int>(job_id % 10000); }

RankEnv read_rank_env(const EnvLookup& env) {
  RankEnv r;
  const char* torchrun_vars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  int present = 0;
  std::string missing;
  for (const char* v : torchrun_vars) {
    if (has(env, v)) ++present;
    else missing += std::string(missing.empty() ? "" : ", ") + v;
  }

  // A job script that calls a plain `srun` may export MASTER_ADDR/MASTER_PORT alone (sbatch/
  // does: the InfiniBand address, a port from the job id); rank and world size then come from
  // SLURM_* below. That is not a half-set torchrun environment.
  const bool srun_with_master = has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS") &&
                                !has(env, "RANK") && !has(env, "LOCAL_RANK") &&
                                !has(env, "WORLD_SIZE");
  if (present > 0 && present < 5 && !srun_with_master) {
    // A half-set environment is the classic "forgot to export one variable" mistake: refuse it
    // instead of guessing, because a guess (world size 1) silently trains alone.
    throw SetupError("partial rank environment: " + missing +
                     (present == 4 && missing.find(',') == std::string::npos ? " is" : " are") +
                     " not set. Launch with ddprun or srun, or set RANK, LOCAL_RANK, WORLD_SIZE, "
                     "MASTER_ADDR and MASTER_PORT together");
  }
  if (present == 5) {
    r.launcher = "env";
    r.world_size = parse_int("WORLD_SIZE", env("WORLD_SIZE"), 1, 1 << 20);
    r.rank = parse_int("RANK", env("RANK"), 0, r.world_size - 1);
    r.local_rank = parse_int("LOCAL_RANK", env("LOCAL_RANK"), 0, r.world_size - 1);
    r.local_world_size = has(env, "LOCAL_WORLD_SIZE")
        ? parse_int("LOCAL_WORLD_SIZE", env("LOCAL_WORLD_SIZE"), 1, r.world_size)
        : (has(env, "SLURM_NTASKS_PER_NODE") ? 0 : r.world_size);
    // Said by the launcher, so a contradiction is the launcher's mistake, not something to guess
    // around (below, only the counts derived from Slurm's per-node list are raised).
    if (has(env, "LOCAL_WORLD_SIZE") && r.local_rank >= r.local_world_size)
      throw SetupError("LOCAL_RANK=" + std::to_string(r.local_rank) + " is not below LOCAL_WORLD_SIZE=" +
                       std::to_string(r.local_world_size) + ": the launcher's local ranks per node "
                       "disagree");
    r.master_addr = env("MASTER_ADDR");
    r.master_port = parse_int("MASTER_PORT", env("MASTER_PORT"), 1, 65535);
  } else if (has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS")) {
    // A plain `srun ./trainer`: one task per GPU, Slurm numbers the tasks for us.
    r.launcher = "slurm";
    r.world_size = parse_int("SLURM_NTASKS", env("SLURM_NTASKS"), 1, 1 << 20);
    r.rank = parse_int("SLURM_PROCID", env("SLURM_PROCID"), 0, r.world_size - 1);
    if (!has(env, "SLURM_LOCALID"))
      throw SetupError("SLURM_PROCID is set but SLURM_LOCALID is not: launch the trainer with srun");
    r.local_rank = parse_int("SLURM_LOCALID", env("SLURM_LOCALID"), 0, r.world_size - 1);
    r.local_world_size = 0;
    if (has(env, "MASTER_ADDR")) {
      r.master_addr = env("MASTER_ADDR");
    } else if (has(env, "SLURM_JOB_NODELIST") || has(env, "SLURM_NODELIST")) {
      r.master_addr = first_host(env(has(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                                    : "SLURM_NODELIST"));
    } else if (r.world_size > 1) {
      throw SetupError("srun launch without SLURM_JOB_NODELIST or MASTER_ADDR: cannot tell "
                       "where rank 0 listens");
    }
    if (has(env, "MASTER_PORT")) {
      r.master_port = parse_int("MASTER_PORT", env("MASTER_PORT"), 1, 65535);
    } else if (has(env, "SLURM_JOB_ID")) {
      r.master_port = port_for_job(parse_int("SLURM_JOB_ID", env("SLURM_JOB_ID"), 0, 2147483646));
    } else if (r.world_size > 1) {
      throw SetupError("srun launch without SLURM_JOB_ID or MASTER_PORT: cannot pick a port");
    }
  }
  if (r.local_world_size == 0) {
    // Tasks on this node: Slurm says it as "4" or "4(x2)" (per node, repeated).
    const char* per_node = env("SLURM_NTASKS_PER_NODE");
    if (per_node == nullptr || *per_node == '\0') per_node = env("SLURM_TASKS_PER_NODE");
    r.local_world_size = per_node && *per_node ? std::atoi(per_node) : 1;
    if (r.local_world_size < 1) r.local_world_size = 1;
  }
  if (r.local_rank >= r.local_world_size && r.launcher != "none")
    r.local_world_size = r.local_rank + 1;
  return r;
}

RankEnv read_rank_env() {
  return read_rank_env([](const char* name) { return std::getenv(name); });
}

}  // namespace kit
