# shellcheck shell=bash disable=SC2034  # the KIT_* variables are for the job scripts
# sbatch/job.sh: the checks and settings that every job script of the kit shares. The job
# scripts (sbatch/<exercise>/*.sbatch) source it; it is not a program of its own.
#
#   kit_job_init NAME [--no-data | --cifar10 | --era5 | --xsum]
#                       checks the job and sets the KIT_* variables below, or stops the job with
#                       one line on stderr (in the job's %x-%j.err file) saying what to do:
#                         * the site profile KIT_SITE does not exist;
#                         * the program is not built;
#                         * the data is not staged (compute nodes have no internet); not
#                           checked with --no-data, for a program that reads none (exercise 00);
#                           with --cifar10, CIFAR-10's six binary files instead of WikiText-2;
#                           with --era5, the weather fields of exercise 06 (train/, valid/ and
#                           stats/ in NERSC's layout, common/kit/data/era5.h); with --xsum,
#                           the capstone's xsum.h5, which `./kit data xsum DIR` prepares on the
#                           login node (common/data/XSUM.md);
#                         * the job has no GPU, or more tasks per node were requested than GPUs;
#                         * fewer CPUs than tasks on a node.
#                       Then it runs the site profile's kit_site_env (modules, network settings).
#   kit_gpu_ids         "0,1,2,3": the GPUs of this node as CUDA numbers them in this job.
#   kit_first_node      the first host name of the job's node list: where rank 0 runs.
#   kit_master_addr     the address of kit_first_node that the other nodes should use; the site
#                       profile decides (InfiniBand name on JSC systems, else the host name).
#   kit_job_port        the rendezvous port of this job: $KIT_MASTER_PORT if set, else
#                       20000 + SLURM_JOB_ID % 10000 (the same as kit::port_for_job in common/).
#   kit_show_job        prints what is about to run (node list, GPUs, tasks, rendezvous).
#   kit_step CMD...     runs the job step CMD (srun ...) in the background, passes Slurm's
#                       time-limit warning (USR1) and SIGTERM on to it, and requeues the job when
#                       the trainer stopped at a checkpoint before the time limit (see below).
#
# Variables that kit_job_init sets:
#   KIT_PROGRAM        the trainer: $KIT_BUILD/bin/NAME (or $KIT_PROGRAM as given by you)
#   KIT_DATA           the data folder: $KIT_DATA_DIR, else $WIKITEXT2_DIR, else
#                      $HOME/data/wikitext-2 (the download script's default); with --cifar10
#                      $KIT_DATA_DIR, else $CIFAR10_DIR, else $HOME/data/cifar-10; with --era5
#                      $KIT_DATA_DIR, else $ERA5_DIR, else $HOME/data/era5; with --xsum
#                      $KIT_DATA_DIR, else $XSUM_DIR, else $HOME/data/xsum (./kit data's default)
#   KIT_OUT            where the trainer writes metrics.csv and the models:
#                      $KIT_OUT_DIR, else runs/<job name>-<job id> in the folder you submitted from
#   KIT_GPUS_PER_NODE  the GPUs this job has on each node (from --gres)
#   KIT_TASKS_PER_NODE one task per GPU, or fewer when you ask for fewer (--ntasks-per-node)
#   KIT_NTASKS         KIT_TASKS_PER_NODE x the number of nodes
#   KIT_CPUS_PER_TASK  the job's CPUs on a node divided by the tasks on it
#
# Settings you may pass in the environment of sbatch (sbatch forwards your environment):
#   KIT_SITE           the site profile, sbatch/sites/$KIT_SITE.sh (default: generic)
#   KIT_ROOT           the kit's folder (default: the folder you submitted from, or a parent)
#   KIT_BUILD          the build folder (default: $KIT_ROOT/build)
#   KIT_PROGRAM        another trainer to run, e.g. a stage checkpoint: a path, or a name in
#                      $KIT_BUILD/bin
#   KIT_DATA_DIR, KIT_OUT_DIR, KIT_MASTER_PORT   see above
#   KIT_MAX_REQUEUES   how often one job may requeue itself (default 20)

kit_die() {
  printf '%s: error: %s\n' "${KIT_JOB_NAME:-${SLURM_JOB_NAME:-job}}" "$*" >&2
  exit 1
}

kit_say() { printf '%s: %s\n' "${KIT_JOB_NAME:-${SLURM_JOB_NAME:-job}}" "$*"; }

# "jwb[0012-0015,0020],login1" -> "jwb0012" without scontrol (the rule of kit::first_host).
kit_first_of_nodelist() {
  local list=$1 first='' c depth=0 i pre rest inner
  for ((i = 0; i < ${#list}; i++)); do
    c=${list:i:1}
    case $c in
      '[') depth=$((depth + 1)) ;;
      ']') depth=$((depth - 1)) ;;
      ,) [ "$depth" -eq 0 ] && break ;;
    esac
    first+=$c
  done
  # Every "[a-b,c]" becomes its first value "a" (zero padding kept).
  while [[ $first == *\[*\]* ]]; do
    pre=${first%%\[*} rest=${first#*\[}
    inner=${rest%%\]*} rest=${rest#*\]}
    first=$pre${inner%%[,-]*}$rest
  done
  printf '%s\n' "$first"
}

kit_first_node() {
  local list=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}} hosts
  [ -n "$list" ] || kit_die "SLURM_JOB_NODELIST is not set: is this a Slurm job?"
  if hosts=$(scontrol show hostnames "$list" 2>/dev/null) && [ -n "$hosts" ]; then
    printf '%s\n' "${hosts%%$'\n'*}"
  else
    kit_first_of_nodelist "$list"
  fi
}

# The site profile may define kit_site_master_addr HOST; without it, the host name is the address.
kit_master_addr() {
  local host
  host=$(kit_first_node) || exit 1
  if declare -F kit_site_master_addr >/dev/null; then
    kit_site_master_addr "$host"
  else
    printf '%s\n' "$host"
  fi
}

kit_job_port() {
  if [ -n "${KIT_MASTER_PORT:-}" ]; then
    case $KIT_MASTER_PORT in
      *[!0-9]*) kit_die "KIT_MASTER_PORT='$KIT_MASTER_PORT' is not a port number" ;;
    esac
    printf '%s\n' "$KIT_MASTER_PORT"
  else
    # Derived from the job id: two jobs sharing a node get different ports, and 20000-29999 lies
    # below the Linux ephemeral range (32768-60999), where outgoing connections take theirs.
    printf '%s\n' "$((20000 + SLURM_JOB_ID % 10000))"
  fi
}

# The GPUs as Slurm numbered them for the job at its start, when that list has the right length,
# else 0..G-1.
kit_gpu_ids() {
  local ids=${KIT_SLURM_GPU_IDS:-} n=0 i
  if [ -n "$ids" ]; then
    n=$(($(printf '%s' "$ids" | tr -cd , | wc -c) + 1))
  fi
  if [ "$n" -ne "${KIT_GPUS_PER_NODE:-0}" ]; then
    ids=0
    for ((i = 1; i < KIT_GPUS_PER_NODE; i++)); do ids+=",$i"; done
  fi
  printf '%s\n' "$ids"
}

# The site profile's kit_site_env (modules, network settings), in a batch shell: `module` may
# need initialising there, and module scripts do not survive `set -eu`. On failure the profile
# has printed its one line; the job stops.
kit_run_site_env() {
  declare -F kit_site_env >/dev/null || return 0
  local rc=0 init
  set +eu
  if ! declare -F module >/dev/null; then
    for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh "${LMOD_PKG:-/nonexistent}/init/bash"; do
      # shellcheck disable=SC1090
      [ -f "$init" ] && . "$init" && break
    done
  fi
  kit_site_env || rc=$?
  set -eu
  [ "$rc" -eq 0 ] || exit 1
}

kit_job_init() {
  local name=$1 needs_data=1 cifar10=0 era5=0 xsum=0
  case ${2:-} in
    '') ;;
    --no-data) needs_data=0 ;;
    --cifar10) cifar10=1 ;;  # exercise 02's data, CIFAR-10's binary files
    --era5) era5=1 ;;        # exercise 06's data, weather fields in NERSC's HDF5 layout
    --xsum) xsum=1 ;;        # the capstone's data, XSum tokenised into one HDF5 file
    *) kit_die "kit_job_init: unknown option '$2' (the job script is broken)" ;;
  esac
  KIT_JOB_NAME=${SLURM_JOB_NAME:-$name}

  KIT_SITE=${KIT_SITE:-generic}
  local profile=$KIT_ROOT/sbatch/sites/$KIT_SITE.sh known f
  if [ ! -f "$profile" ]; then
    known=
    for f in "$KIT_ROOT"/sbatch/sites/*.sh; do
      f=${f##*/}
      known+=" ${f%.sh}"
    done
    kit_die "unknown site KIT_SITE=$KIT_SITE: no $profile (known sites:$known)"
  fi
  # shellcheck disable=SC1090
  . "$profile"

  KIT_BUILD=${KIT_BUILD:-$KIT_ROOT/build}
  case ${KIT_PROGRAM:-} in
    '') KIT_PROGRAM=$KIT_BUILD/bin/$name ;;
    */*) ;;
    *) KIT_PROGRAM=$KIT_BUILD/bin/$KIT_PROGRAM ;;
  esac
  [ -x "$KIT_PROGRAM" ] ||
    kit_die "$KIT_PROGRAM is not built: build it on the login node with" \
      "'cmake --build $KIT_BUILD --target ${KIT_PROGRAM##*/}' (configure first as sbatch/README.md" \
      "says under 'On the cluster'), or set KIT_BUILD to your build folder"

  KIT_DATA=${KIT_DATA_DIR:-${WIKITEXT2_DIR:-${HOME:-}/data/wikitext-2}}
  local split
  if [ "$cifar10" = 1 ]; then
    needs_data=0
    KIT_DATA=${KIT_DATA_DIR:-${CIFAR10_DIR:-${HOME:-}/data/cifar-10}}
    for split in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
      [ -s "$KIT_DATA/$split.bin" ] ||
        kit_die "the data is not staged: $KIT_DATA/$split.bin is missing; compute nodes have" \
          "no internet, so on the login node run" \
          "'$KIT_ROOT/common/data/download_cifar10.sh $KIT_DATA' (or set KIT_DATA_DIR)"
    done
  fi
  if [ "$era5" = 1 ]; then
    needs_data=0
    KIT_DATA=${KIT_DATA_DIR:-${ERA5_DIR:-${HOME:-}/data/era5}}
    for split in train valid stats/global_means.npy stats/global_stds.npy; do
      [ -e "$KIT_DATA/$split" ] ||
        kit_die "the data is not staged: $KIT_DATA/$split is missing: point KIT_DATA_DIR at" \
          "NERSC's course data (train/, valid/, stats/; where to get it: exercise 06's page)" \
          "or at fields made with '$KIT_BUILD/bin/make_weather --out DIR'"
    done
  fi
  if [ "$xsum" = 1 ]; then
    # Prepared on the login node (download, tokenizer, HDF5): nothing of it can happen here.
    # xsum.h5 appears under its name only when complete (xsum_data.py writes a .part first).
    needs_data=0
    KIT_DATA=${KIT_DATA_DIR:-${XSUM_DIR:-${HOME:-}/data/xsum}}
    [ -s "$KIT_DATA/xsum.h5" ] ||
      kit_die "the data is not prepared: $KIT_DATA/xsum.h5 is missing; compute nodes have no" \
        "internet, so on the login node run '$KIT_ROOT/kit data xsum $KIT_DATA' and submit" \
        "with XSUM_DIR=$KIT_DATA (or KIT_DATA_DIR)"
  fi
  for split in train valid test; do
    [ "$needs_data" = 0 ] || [ -s "$KIT_DATA/wiki.$split.tokens" ] ||
      kit_die "the data is not staged: $KIT_DATA/wiki.$split.tokens is missing; compute nodes" \
        "have no internet, so on the login node run" \
        "'$KIT_ROOT/common/data/download_wikitext2.sh $KIT_DATA' (or set KIT_DATA_DIR)"
  done

  # GPUs: what --gres gave this job on each node.
  KIT_SLURM_GPU_IDS=${CUDA_VISIBLE_DEVICES:-}
  KIT_GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-}
  if [ -z "$KIT_GPUS_PER_NODE" ] && [ -n "$KIT_SLURM_GPU_IDS" ]; then
    KIT_GPUS_PER_NODE=$(($(printf '%s' "$KIT_SLURM_GPU_IDS" | tr -cd , | wc -c) + 1))
  fi
  case ${KIT_GPUS_PER_NODE:-0} in
    '' | *[!0-9]* | 0)
      kit_die "this job has no GPU: request them with '#SBATCH --gres=gpu:N' (or sbatch --gres=gpu:N)"
      ;;
  esac

  # Tasks: one per GPU. Fewer if you asked for fewer; more is an error (two ranks on one GPU).
  local nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}} asked=
  if [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then
    asked=$SLURM_NTASKS_PER_NODE
  elif [ -n "${SLURM_NTASKS:-}" ]; then
    asked=$(((SLURM_NTASKS + nodes - 1) / nodes))
  fi
  if [ -n "$asked" ] && [ "$asked" -gt "$KIT_GPUS_PER_NODE" ]; then
    kit_die "$asked tasks per node requested but only $KIT_GPUS_PER_NODE GPU(s) per node:" \
      "start one task per GPU (lower --ntasks-per-node/--ntasks or raise --gres=gpu:N)"
  fi
  KIT_TASKS_PER_NODE=${asked:-$KIT_GPUS_PER_NODE}
  KIT_NTASKS=$((KIT_TASKS_PER_NODE * nodes))

  local cpus=${SLURM_CPUS_ON_NODE:-1}
  case $cpus in *[!0-9]* | '') cpus=1 ;; esac
  KIT_CPUS_PER_TASK=$((cpus / KIT_TASKS_PER_NODE))
  [ "$KIT_CPUS_PER_TASK" -ge 1 ] ||
    kit_die "only $cpus CPU(s) per node for $KIT_TASKS_PER_NODE tasks:" \
      "request CPUs with --cpus-per-gpu=N (or SBATCH_CPUS_PER_GPU)"

  KIT_OUT=${KIT_OUT_DIR:-${SLURM_SUBMIT_DIR:-.}/runs/${SLURM_JOB_NAME:-$name}-${SLURM_JOB_ID:-0}}
  mkdir -p "$KIT_OUT" || kit_die "cannot create the output folder $KIT_OUT (set KIT_OUT_DIR)"

  kit_run_site_env
}

kit_show_job() {
  kit_say "job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NUM_NODES:-1} node(s)" \
    "${SLURM_JOB_NODELIST:-?}, site $KIT_SITE"
  if [ -n "${SLURM_JOB_RESERVATION:-}" ]; then kit_say "reservation: $SLURM_JOB_RESERVATION"; fi
  kit_say "GPUs per node: $KIT_GPUS_PER_NODE allocated," \
    "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-(unset)}"
  kit_say "rendezvous: MASTER_ADDR=${MASTER_ADDR:-(unset)} MASTER_PORT=${MASTER_PORT:-(unset)}"
  kit_say "program: $KIT_PROGRAM"
  kit_say "data: $KIT_DATA, output: $KIT_OUT"
  if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
    kit_say "restart $SLURM_RESTART_COUNT of this job: the trainer continues from the newest" \
      "checkpoint in $KIT_OUT"
  fi
}

# --- Trainings longer than the time limit ------------------------------------------------------
#
# The job scripts ask for `#SBATCH --signal=B:USR1@120`: 120 s before the time limit Slurm sends
# USR1 to the batch shell, and only to it (B:). A shell runs a trap only between two commands,
# never while a foreground command runs, so kit_step starts the step in the background and
# waits for it with `wait`, which a trapped signal interrupts. It passes the signal on to srun as
# USR1, srun hands it to every task, and the trainer finishes its step, saves a checkpoint and
# exits 0 (common/kit/train/checkpoint.h). If the training is not finished (no new model-final.pt),
# kit_step requeues the job (`scontrol requeue`, allowed by `#SBATCH --requeue`) and ends the
# script: the job keeps its id, hence its run folder runs/<name>-<id>, and the trainer resumes
# from the newest checkpoint there; `#SBATCH --open-mode=append` keeps every run's output.
# SIGTERM (scancel, preemption) is passed on the same way (as USR1, because srun answers a TERM
# by killing the tasks), but never requeues: a cancelled job stays cancelled.

KIT_STEP_PID=
KIT_STOP_SIGNAL=   # USR1 or TERM once one arrived during kit_step
KIT_GOT_SIGNAL=

kit_pass_on() {
  local sig=$1
  KIT_GOT_SIGNAL=1
  if [ "$sig" = TERM ]; then
    KIT_STOP_SIGNAL=TERM
    kit_say "SIGTERM (job cancelled or preempted): the training saves a checkpoint and stops"
  else
    [ "$KIT_STOP_SIGNAL" = TERM ] || KIT_STOP_SIGNAL=USR1
    kit_say "SIGUSR1 (the time limit is near): the training saves a checkpoint and stops"
  fi
  kill -USR1 "$KIT_STEP_PID" 2>/dev/null || true
}

kit_step() {
  local rc=0 started
  started=$(date +%s)
  KIT_STOP_SIGNAL=
  "$@" &
  KIT_STEP_PID=$!
  trap 'kit_pass_on USR1' USR1
  trap 'kit_pass_on TERM' TERM
  while :; do
    KIT_GOT_SIGNAL=
    rc=0
    wait "$KIT_STEP_PID" || rc=$?
    [ -n "$KIT_GOT_SIGNAL" ] || break  # the step ended; otherwise a signal interrupted `wait`
  done
  trap - USR1 TERM
  if [ "$rc" -eq 0 ] && [ "$KIT_STOP_SIGNAL" = USR1 ] && ! kit_training_finished "$started"; then
    kit_requeue
  fi
  return "$rc"
}

# Did the trainer write model-final.pt at or after the time $1 (seconds since 1970)?
kit_training_finished() {
  local final=${KIT_OUT:-.}/model-final.pt
  [ -f "$final" ] && [ "$(stat -c %Y "$final")" -ge "$1" ]
}

kit_requeue() {
  local n=${SLURM_RESTART_COUNT:-0} max=${KIT_MAX_REQUEUES:-20} why
  local again="submit again with KIT_OUT_DIR=${KIT_OUT:-<the run folder>} to continue from it"
  [ "$n" -lt "$max" ] ||
    kit_die "the training stopped at a checkpoint before the time limit, but this job was" \
      "requeued $n times already (KIT_MAX_REQUEUES=$max): $again"
  # Said before the requeue, not after: Slurm may end this script as soon as it requeues the job,
  # before a line after `scontrol requeue` could be written.
  kit_say "requeuing job $SLURM_JOB_ID (restart $((n + 1))): the next run continues from the" \
    "checkpoint in ${KIT_OUT:-the run folder}"
  if ! why=$(scontrol requeue "$SLURM_JOB_ID" 2>&1); then
    kit_die "the training stopped at a checkpoint before the time limit, but" \
      "'scontrol requeue $SLURM_JOB_ID' failed (${why//$'\n'/ }): $again"
  fi
  exit 0  # Slurm ends this run of the job now; nothing after the step may run
}
