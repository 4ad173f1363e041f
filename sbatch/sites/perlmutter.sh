# shellcheck shell=bash
# Site profile "perlmutter": NERSC Perlmutter, GPU nodes (4 A100 per node, Slingshot network).
#
# Once, for every later login: sbatch/account.sh m1234_g (your NERSC project's GPU account; see
# sbatch/account.sh), or export SBATCH_ACCOUNT=m1234_g in each shell. The _g: NERSC allocates
# GPU node hours apart from CPU node hours (NERSC's 2022 ERCAP guide, "Separate Allocations for
# GPU-Accelerated and CPU-Only Resources"), and jobs on the GPU nodes charge the project's
# GPU account, its name with _g appended (ImpactX's Perlmutter guide, github.com/ECP-WarpX/
# impactx, docs/source/install/hpc/perlmutter.rst: "Perlmutter GPU projects must end in _g").
# NERSC's "Queues and Charges" page (docs.nersc.gov/jobs/policy/) only says -A <project>; the
# accounts you may charge: sacctmgr show associations user=$USER format=account. On the login
# node, once per shell:
#     source sbatch/sites/perlmutter.sh        # GPU nodes (-C gpu), QOS regular, the account
#     kit_site_env                             # the modules, to build with the same LibTorch
# then:
#     sbatch sbatch/01-transformer-lm-ddp/run.sbatch
# Short test runs: export SBATCH_QOS=debug.
#
# Overrides: KIT_MODULES (default below), SBATCH_QOS, SBATCH_CONSTRAINT.
# The host names (nid...) resolve to the high-speed network, so they serve as MASTER_ADDR.
# See sbatch/sites/generic.sh for how a site profile works.

export KIT_SITE=perlmutter
# The account and partition saved with sbatch/account.sh, where the environment sets none.
# shellcheck source-path=SCRIPTDIR source=../account.sh
. "$(dirname "${BASH_SOURCE[0]}")/../account.sh"
kit_saved_site || :
: "${SBATCH_CONSTRAINT:=gpu}"
: "${SBATCH_QOS:=regular}"
export SBATCH_CONSTRAINT SBATCH_QOS
# NERSC's pytorch module brings LibTorch with CUDA and NCCL (and NCCL's Slingshot plugin).
# Exported: ./kit and a CPU-only build in a GPU job name these modules when they stop.
: "${KIT_MODULES:=pytorch cmake}"
export KIT_MODULES

kit_site_env() {
  # shellcheck disable=SC2086  # a list of module names
  module load $KIT_MODULES >/dev/null 2>&1 || {
    echo "site $KIT_SITE: 'module load $KIT_MODULES' failed: check the names with 'module avail pytorch' and set KIT_MODULES" >&2
    return 1
  }
  return 0
}
