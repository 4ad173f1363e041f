# shellcheck shell=bash
# Site profile "generic": any Slurm cluster whose GPUs are a GRES (--gres=gpu:N). The default
# when KIT_SITE is not set. Copy this file to add a site (see "How a site profile works" below).
#
#   Before sbatch, tell Slurm your account and partition, once for every later login:
#       sbatch/account.sh <your project> <a GPU partition>
#   (saved in ~/.config/ddp-kit/site.env; sourcing this profile exports them as SBATCH_ACCOUNT
#   and SBATCH_PARTITION), or once per shell:
#       export SBATCH_ACCOUNT=<your project> SBATCH_PARTITION=<a GPU partition>
#   or on the command line:  sbatch -A <project> -p <partition> sbatch/01-.../run.sbatch
#   Modules the build and the job need (if any): export KIT_MODULES="<names>"
#
# How a site profile works
# ------------------------
# The job scripts are the same on every site: their #SBATCH lines hold only what the exercise
# is about (nodes, GPUs, time, file names). #SBATCH lines cannot read variables, so whatever
# differs between sites reaches Slurm in one of two other ways:
#   * at submission, through the SBATCH_* environment variables that sbatch reads (SBATCH_ACCOUNT,
#     SBATCH_PARTITION, SBATCH_QOS, SBATCH_CONSTRAINT, SBATCH_RESERVATION, SBATCH_CPUS_PER_GPU,
#     ...). Precedence: sbatch command line > SBATCH_* variables > #SBATCH lines. A profile
#     exports defaults for them when you source it on the login node:
#         source sbatch/sites/<name>.sh        # sets KIT_SITE=<name> and the SBATCH_* defaults
#         kit_site_env                         # optional: the site's modules, for the build
#     A profile must never export SBATCH_GRES, SBATCH_GPUS*, SBATCH_NTASKS* or SBATCH_NODES:
#     those would override the #SBATCH lines that the exercise's TODOs change.
#   * inside the job: sbatch/job.sh sources sbatch/sites/$KIT_SITE.sh on the first node (sbatch
#     forwards KIT_SITE from your shell) and calls the two optional functions below.
#
# A profile only sets variables and defines functions: it is sourced into your login shell, so
# it must not exit, and it must work with and without `set -eu`.
#   kit_site_env               load modules, set network variables (NCCL_*, ...). On failure:
#                              print ONE line to stderr and return non-zero; the job stops.
#   kit_site_master_addr HOST  print the address at which the other nodes reach HOST, the
#                              first node of the job (rank 0). Without it: HOST itself.

export KIT_SITE=generic
# The account and partition saved with sbatch/account.sh, where the environment sets none.
# shellcheck source-path=SCRIPTDIR source=../account.sh
. "$(dirname "${BASH_SOURCE[0]}")/../account.sh"
kit_saved_site || :

kit_site_env() {
  if [ -n "${KIT_MODULES:-}" ]; then
    # shellcheck disable=SC2086  # a list of module names
    module load $KIT_MODULES >/dev/null 2>&1 || {
      echo "site $KIT_SITE: 'module load $KIT_MODULES' failed: check the names with 'module avail' and set KIT_MODULES" >&2
      return 1
    }
  fi
  return 0
}
