# shellcheck shell=bash
# Site profile "jsc": the GPU systems of the Jülich Supercomputing Centre, JURECA-DC (partition
# dc-gpu, 4 A100 per node) and JUWELS Booster (partition booster, 4 A100 per node). Use
# KIT_SITE=jureca or KIT_SITE=juwels-booster, which set the system and come here; KIT_SITE=jsc
# picks the system from $SYSTEMNAME (set by JSC on every login and compute node).
#
# On the login node, once per shell (or save the project once: sbatch/account.sh <project>):
#     jutil env activate -p <project>          # sets $BUDGET_ACCOUNTS, used as the account
#     source sbatch/sites/jureca.sh            # or juwels-booster.sh
#     kit_site_env                             # the modules, to build with the same LibTorch
# then:
#     sbatch sbatch/01-transformer-lm-ddp/run.sbatch
# Short test runs: export SBATCH_PARTITION=dc-gpu-devel (JURECA-DC) or develbooster (JUWELS).
#
# Overrides (export before sourcing or before sbatch):
#   KIT_MODULES       the modules to load (default below; check `module spider PyTorch`: the
#                     names follow the software stage of the year)
#   SBATCH_ACCOUNT    the budget to charge (default: $BUDGET_ACCOUNTS, else the saved one)
#   SBATCH_PARTITION  the partition (default: the saved one, else dc-gpu or booster)
#
# See sbatch/sites/generic.sh for how a site profile works.

export KIT_SITE=jsc
# The account: SBATCH_ACCOUNT, else $BUDGET_ACCOUNTS (jutil env activate), else the one saved
# with sbatch/account.sh. The partition: SBATCH_PARTITION, else the saved one, else below.
: "${SBATCH_ACCOUNT:=${BUDGET_ACCOUNTS:-}}"
# shellcheck source-path=SCRIPTDIR source=../account.sh
. "$(dirname "${BASH_SOURCE[0]}")/../account.sh"
kit_saved_site || :
: "${KIT_JSC_SYSTEM:=${SYSTEMNAME:-}}"
case $KIT_JSC_SYSTEM in
  jurecadc | jureca) : "${SBATCH_PARTITION:=dc-gpu}" ;;
  juwelsbooster | juwels-booster | juwels) : "${SBATCH_PARTITION:=booster}" ;;
esac
[ -n "${SBATCH_PARTITION:-}" ] && export SBATCH_PARTITION
if [ -n "$SBATCH_ACCOUNT" ]; then export SBATCH_ACCOUNT; else unset SBATCH_ACCOUNT; fi
# PyTorch brings LibTorch (CMake finds it with the prefix path of the top-level CMakeLists.txt),
# CUDA, cuDNN and NCCL; GCC and OpenMPI are its toolchain. Exported: ./kit and a trainer built
# against a CPU-only torch name these modules when they stop for want of them.
: "${KIT_MODULES:=Stages/2025 GCC OpenMPI PyTorch CMake}"
export KIT_MODULES

kit_site_env() {
  # shellcheck disable=SC2086  # a list of module names
  module load $KIT_MODULES >/dev/null 2>&1 || {
    echo "site $KIT_SITE: 'module load $KIT_MODULES' failed: check the names with 'module spider PyTorch' and set KIT_MODULES" >&2
    return 1
  }
  return 0
}

# JSC compute nodes talk InfiniBand under their name with an "i" appended (jrc0001 ->
# jrc0001i); the plain name is the slower Ethernet. Rank 0 listens on the InfiniBand address.
kit_site_master_addr() {
  local addr
  addr=$(getent ahostsv4 "${1}i" 2>/dev/null | awk 'NR == 1 { print $1 }') || addr=
  if [ -n "$addr" ]; then
    printf '%s\n' "$addr"
  else
    echo "site $KIT_SITE: cannot resolve ${1}i, the InfiniBand name of $1: using $1" >&2
    printf '%s\n' "$1"
  fi
}
