# shellcheck shell=bash disable=SC2034  # the variables are for the test scripts
# tests/slurm/lib.sh: what the Slurm tests share. Sourced by tests/slurm/test_*.sh.
#
#   boot_cluster            start a throw-away cluster (cluster.sh) in a temporary folder and
#                           stop it on exit, whatever happens (EXIT trap); exports SLURM_CONF
#   submit DIR SCRIPT [SBATCH OPTIONS...] [-- SCRIPT ARGS...]
#                           sbatch SCRIPT from DIR with the local site profile, wait until the
#                           job has ended; sets JOB, STATE (COMPLETED, FAILED...), OUT and ERR
#                           (the paths of the job's %x-%j.out and %x-%j.err). JOB_SITE,
#                           JOB_BUILD, JOB_DATA replace KIT_SITE (local), KIT_BUILD, KIT_DATA_DIR.
#   check NAME COMMAND...   run COMMAND; print "ok NAME" or "FAIL NAME" (and count failures)
#   finish                  print a summary; the exit status is 1 if any check failed
#   final_loss, ddprun_loss, same_final_loss   a job's final loss against ddprun's without Slurm
#   expect_job              ./kit check NN --job's verdicts on a job script (exercises 04, 05)
#
# Environment (CTest passes these; the defaults suit a build in ./build):
#   KIT_ROOT       the kit's folder                          (default: two levels up)
#   KIT_BUILD      the build folder with bin/ex01-* and bin/ddprun   (default: $KIT_ROOT/build)
#   KIT_TEST_DATA  the corpus the trainers read              (default: $KIT_BUILD/data/wikitext-2)

TESTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${KIT_ROOT:-$(cd "$TESTS_DIR/../.." && pwd)}
BUILD=${KIT_BUILD:-$ROOT/build}
DATA=${KIT_TEST_DATA:-$BUILD/data/wikitext-2}
SBATCH_DIR=$ROOT/sbatch/01-transformer-lm-ddp
# Small and quick: 8 ranks share two real cores.
QUICK=(--epochs 1 --max-steps 5 --d-model 32 --layers 1 --seq-len 16)
JOB_TIMEOUT=${KIT_SLURM_JOB_TIMEOUT:-240}   # seconds a test waits for one job
FAILED=0
export OMP_NUM_THREADS=1   # the jobs (local profile) and ddprun alike
CLUSTER=
# Whatever the caller has from a real Slurm job must not leak into the jobs or into ddprun.
unset SLURM_JOB_ID SLURM_JOBID SLURM_PROCID SLURM_LOCALID SLURM_NTASKS SLURM_NTASKS_PER_NODE \
  SLURM_JOB_NODELIST SLURM_NODELIST SLURM_CPUS_PER_TASK RANK LOCAL_RANK WORLD_SIZE \
  MASTER_ADDR MASTER_PORT CUDA_VISIBLE_DEVICES KIT_MASTER_PORT KIT_PROGRAM KIT_OUT_DIR
while IFS= read -r var; do unset "$var"; done < <(env | sed -n 's/^\(SBATCH_[A-Z_]*\)=.*/\1/p')

say() { printf '%s\n' "$*"; }

check() {
  local name=$1
  shift
  if "$@"; then
    say "ok   $name"
  else
    say "FAIL $name"
    FAILED=$((FAILED + 1))
  fi
}

finish() {
  if [ "$FAILED" -eq 0 ]; then
    say "all checks passed"
    exit 0
  fi
  say "$FAILED check(s) failed"
  exit 1
}

# What the jobs of a test run: exercise 01 by default; a test of another exercise sets NEEDS
# before boot_cluster.
NEEDS=("$BUILD/bin/ex01-solution" "$BUILD/bin/ex01-exercise" "$BUILD/bin/ddprun" "$DATA/wiki.train.tokens")
need_build() {
  local f
  for f in "${NEEDS[@]}"; do
    [ -e "$f" ] || { say "missing $f: build the kit first (targets ex01-solution ex01-exercise ddprun corpus)"; exit 1; }
  done
}

stop_cluster() {
  [ -n "$CLUSTER" ] || return 0
  # Jobs first (their steps are not children of this shell), then the daemons.
  scancel --quiet --full --user=root 2>/dev/null || true
  "$TESTS_DIR/cluster.sh" stop "$CLUSTER"
  if [ "${KIT_SLURM_KEEP:-0}" = 1 ]; then
    say "kept $CLUSTER"
  else
    rm -rf "${CLUSTER%%/as-deep-as-*}"
  fi
  CLUSTER=
}

boot_cluster() {
  need_build
  # Deep on purpose: a CI clone puts the clusters of check --job deep in its build tree, and
  # Unix sockets in the cluster's folder would not fit in their 108 bytes (cluster.sh start).
  CLUSTER=$(mktemp -d "${TMPDIR:-/tmp}/kit-slurm.XXXXXX")/as-deep-as-a-build-tree-of-a-ci-clone/tests/slurm/job-mutants/ntasks-one-node/check/cluster
  mkdir -p "$CLUSTER" || { say "cannot create $CLUSTER"; exit 1; }
  trap stop_cluster EXIT
  trap 'exit 130' INT TERM
  local rc=0
  "$TESTS_DIR/cluster.sh" start "$CLUSTER" || rc=$?
  if [ "$rc" -ne 0 ]; then
    say "the test cluster did not start (logs: $CLUSTER/log)"
    KIT_SLURM_KEEP=1
    exit "$rc"
  fi
  SLURM_CONF=$("$TESTS_DIR/cluster.sh" conf "$CLUSTER")
  export SLURM_CONF
}

# job_field NAME: the value of NAME= in `scontrol show job $JOB`.
job_field() {
  timeout 30 scontrol -o show job "$JOB" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}

submit() {
  local dir=$1 script=$2
  shift 2
  local opts=() args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  args=("$@")
  mkdir -p "$dir"
  JOB=$(cd "$dir" && KIT_SITE=${JOB_SITE:-local} KIT_ROOT=$ROOT KIT_BUILD=${JOB_BUILD:-$BUILD} \
        KIT_DATA_DIR=${JOB_DATA:-$DATA} sbatch --parsable "${opts[@]}" "$script" "${args[@]}") ||
    { STATE=SUBMIT_FAILED; return 1; }
  JOB=${JOB%%;*}
  local waited=0
  STATE=
  while :; do
    STATE=$(job_field JobState)
    case $STATE in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) break ;;
      '') STATE=GONE; break ;;
      PENDING)  # a job Slurm could not launch is held for an administrator: stop waiting
        case $(job_field Reason) in launch_failed* | JobHeld*)
          say "job $JOB is held: $(job_field Reason)"
          tail -n 15 "$CLUSTER"/log/*.log 2>/dev/null
          scancel "$JOB" 2>/dev/null
          STATE=HELD
          break ;;
        esac ;;
    esac
    if [ "$waited" -ge $((JOB_TIMEOUT * 5)) ]; then
      # Say what Slurm thought of the job, and what the daemons logged last: a job that never
      # ends leaves nothing else to go on.
      say "job $JOB not done after $JOB_TIMEOUT s: still $STATE, reason $(job_field Reason)"
      tail -n 15 "$CLUSTER"/log/*.log 2>/dev/null
      scancel "$JOB" 2>/dev/null
      STATE=TIMED_OUT_IN_TEST
      break
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  local name
  name=$(job_field JobName)
  OUT=$dir/${name:-ex01}-$JOB.out
  ERR=$dir/${name:-ex01}-$JOB.err
  say "job $JOB ($(basename "$script") ${opts[*]}): $STATE"
}

# show: the job's output, for the log of a failed test.
show() {
  say "--- $OUT"
  cat "$OUT" 2>/dev/null
  say "--- $ERR"
  cat "$ERR" 2>/dev/null
  say "---"
}

# count_lines FILE REGEX: how many lines of FILE match REGEX.
count_lines() { grep -cE -- "$2" "$1" 2>/dev/null || true; }

# expect_count N REGEX [FILE]: exactly N lines of FILE (default $OUT) match REGEX.
expect_count() {
  local n=$1 re=$2 file=${3:-$OUT} got
  got=$(count_lines "$file" "$re")
  [ "$got" -eq "$n" ] && return 0
  say "  expected $n line(s) matching /$re/ in $(basename "$file"), got $got"
  return 1
}

# expect_ranks W [G]: ranks 0..W-1 each printed their line once, with local rank R % G on node
# R / G (G ranks per node, default 4: Slurm's block distribution).
expect_ranks() {
  local w=$1 g=${2:-4} r ok=0
  expect_count "$w" '^rank [0-9]+ of [0-9]+: local rank [0-9]+, device ' || ok=1
  for ((r = 0; r < w; r++)); do
    expect_count 1 "^rank $r of $w: local rank $((r % g)), device [a-z0-9:]+$" || ok=1
  done
  return "$ok"
}

# expect_rank_reports W G CSV: at the epoch's end every rank reported its own work: rank 0 printed
# one line per rank R, placed on node kitn(R / G + 1) (Slurm's block distribution), with more than
# zero samples/s; and CSV (the job's metrics.csv) has one row per rank for the epoch, each with a
# throughput above zero.
expect_rank_reports() {
  local w=$1 g=$2 csv=$3 r ok=0 rows
  expect_count "$w" '^  epoch 1, rank [0-9]+ \(' || ok=1
  for ((r = 0; r < w; r++)); do
    expect_count 1 "^  epoch 1, rank $r \\(kitn$((r / g + 1)), [a-z0-9:]+\\): [1-9][0-9]* samples/s, peak memory " || ok=1
  done
  rows=$(awk -F, 'NR > 1 && $7 != "" && $4 > 0 { print $7 }' "$csv" 2>/dev/null | sort -n | uniq | wc -l)
  if [ "$rows" -ne "$w" ]; then
    say "  $csv: $rows rank(s) with a throughput above zero, expected $w"
    ok=1
  fi
  return "$ok"
}

# expect_once PATTERN...: each pattern matches exactly one line of the job's output (rank 0's
# result lines: printed once, not once per rank).
expect_once() {
  local ok=0 re
  for re in "$@"; do expect_count 1 "$re" || ok=1; done
  return "$ok"
}

# expect_rank0_once: each of rank 0's lines of exercise 01's trainer appears exactly once.
expect_rank0_once() {
  expect_once '^\[1/1\] train loss [0-9.]+, validation loss [0-9.]+ \(perplexity [0-9.]+\)$' \
              '^final test loss [0-9.]+ \(perplexity [0-9.]+\)$'
}

expect_state() {
  [ "$STATE" = "$1" ] && return 0
  say "  job $JOB ended $STATE, expected $1"
  return 1
}

# final_loss FILE: the "final test loss ..." line of FILE.
final_loss() { grep -E '^final test loss ' "$1" 2>/dev/null | head -n 1; }

# ddprun_loss N DIR [PROGRAM FLAGS...]: the final loss line of the same training on N local ranks
# (ddprun, without Slurm): PROGRAM (default exercise 01's solution) with FLAGS (default QUICK).
ddprun_loss() {
  local n=$1 dir=$2 program=${3:-$BUILD/bin/ex01-solution}
  shift 2
  [ $# -gt 0 ] && shift  # the flags follow PROGRAM
  local flags=("${QUICK[@]}")
  [ $# -gt 0 ] && flags=("$@")
  mkdir -p "$dir/out"
  OMP_NUM_THREADS=1 "$BUILD/bin/ddprun" --nproc-per-node "$n" -- "$program" \
    --data-dir "$DATA" --out-dir "$dir/out" "${flags[@]}" >"$dir/ddprun.out" 2>"$dir/ddprun.err"
  final_loss "$dir/ddprun.out"
}

# same_final_loss TOL A B WHAT_A WHAT_B: the "final test loss" lines A and B (final_loss) give the same
# loss up to TOL; else one line shows both, named WHAT_A and WHAT_B.
same_final_loss() {
  local tol=$1 a b
  a=$(sed -n 's/^final test loss \([0-9.]*\).*/\1/p' <<<"$2")
  b=$(sed -n 's/^final test loss \([0-9.]*\).*/\1/p' <<<"$3")
  [ -n "$a" ] && [ -n "$b" ] &&
    awk -v a="$a" -v b="$b" -v t="$tol" 'BEGIN { d = a - b; exit !(d <= t && d >= -t) }' && return 0
  say "  $4: '$2', $5: '$3'"
  return 1
}

# expect_job EXERCISE SCRIPT PASSED FAILED: `./kit check NN --job` (common/tools/check_job.py,
# its own cluster, the solution's trainer of EXERCISE, e.g. 04-transformer-lm-tp) on the job
# script SCRIPT says exactly "passed: PASSED" and "failed: FAILED" (TODO labels, comma-separated;
# "-" for none); else its whole output goes to the log.
expect_job() {
  local exercise=$1 script=$2 got
  got=$(python3 "$ROOT/common/tools/check_job.py" --exercise "$exercise" --script "$script" \
    --program "$BUILD/bin/ex${exercise%%-*}-solution" --data "$DATA" --cluster "$TESTS_DIR/cluster.sh" \
    --workdir "$CLUSTER/work/job-$(basename "$script")" 2>&1)
  grep -qx "passed: $3" <<<"$got" && grep -qx "failed: $4" <<<"$got" && return 0
  say "  $script:"; say "$got"
  return 1
}
