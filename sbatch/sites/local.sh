# shellcheck shell=bash
# Site profile "local": the kit's throw-away test cluster (tests/slurm/cluster.sh). Two emulated
# nodes on one machine, four fake GPUs each (device files, no CUDA), so the trainers fall back
# to Gloo on the CPU: KIT_ALLOW_CPU=1 says that is meant (a CPU build in a job with GPUs stops
# otherwise, kit/runtime/env.h; a test sets KIT_ALLOW_CPU=0 to see it stop). The node names are in /etc/hosts, so the first node's name is the
# rendezvous address. Nothing to submit with: the test cluster has one partition and no accounts.
#
#   KIT_SITE=local sbatch sbatch/01-transformer-lm-ddp/solution.sbatch
#
# See sbatch/sites/generic.sh for how a site profile works.

export KIT_SITE=local

kit_site_env() {
  # Up to 8 ranks share the machine's few real cores: one thread each.
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  export KIT_ALLOW_CPU=${KIT_ALLOW_CPU:-1}
  return 0
}
