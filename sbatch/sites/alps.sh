# shellcheck shell=bash
# Site profile "alps": CSCS Alps GH200 nodes (4 GPUs per node, Slingshot network), e.g. the
# Daint or Clariden vClusters.
#
# Software comes as a uenv (or a container of the Container Engine), chosen when you submit.
# Once: sbatch/account.sh <project> (saved for every later login; see sbatch/account.sh). On the
# login node, once per shell:
#     source sbatch/sites/alps.sh              # SBATCH_ACCOUNT from the saved account
# build inside the same uenv that the job uses, then:
#     sbatch --uenv=<pytorch uenv> --view=<its view> sbatch/01-transformer-lm-ddp/run.sbatch
# (or --environment=<EDF file> for a container). Modules, if your uenv has them: KIT_MODULES.
#
# GPU binding: CSCS's Slurm page (github.com/eth-cscs/cscs-docs, docs/running/slurm.md, "NVIDIA
# GH200 GPU Nodes") calls one rank per GPU the most straightforward setup; its example used
# --ntasks-per-node=4 --gpus-per-task=1, so each task sees one GPU. The trainer takes that GPU
# (cuda:0), as it takes GPU LOCAL_RANK when every task sees all four (the job scripts' --gres).
#
# Overrides: SBATCH_PARTITION (default normal; debug for short runs), KIT_MODULES, and every
# NCCL_*/FI_* variable below (set it before sbatch to change it).
# See sbatch/sites/generic.sh for how a site profile works.

export KIT_SITE=alps
# The account and partition saved with sbatch/account.sh, where the environment sets none.
# shellcheck source-path=SCRIPTDIR source=../account.sh
. "$(dirname "${BASH_SOURCE[0]}")/../account.sh"
kit_saved_site || :
: "${SBATCH_PARTITION:=normal}"
export SBATCH_PARTITION

kit_site_env() {
  if [ -n "${KIT_MODULES:-}" ]; then
    # shellcheck disable=SC2086  # a list of module names
    module load $KIT_MODULES >/dev/null 2>&1 || {
      echo "site $KIT_SITE: 'module load $KIT_MODULES' failed: check the names with 'module avail' and set KIT_MODULES" >&2
      return 1
    }
  fi
  # NCCL over Slingshot goes through the libfabric (aws-ofi-nccl) plugin that CSCS's images
  # carry; these are the settings CSCS documents for it.
  export NCCL_NET=${NCCL_NET:-AWS Libfabric}
  export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
  export NCCL_CROSS_NIC=${NCCL_CROSS_NIC:-1}
  export FI_CXI_DISABLE_HOST_REGISTER=${FI_CXI_DISABLE_HOST_REGISTER:-1}
  export FI_MR_CACHE_MONITOR=${FI_MR_CACHE_MONITOR:-userfaultfd}
  export FI_CXI_DEFAULT_CQ_SIZE=${FI_CXI_DEFAULT_CQ_SIZE:-131072}
  export FI_CXI_DEFAULT_TX_SIZE=${FI_CXI_DEFAULT_TX_SIZE:-32768}
  export FI_CXI_RX_MATCH_MODE=${FI_CXI_RX_MATCH_MODE:-software}
  return 0
}
