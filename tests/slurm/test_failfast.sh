#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_failfast.sh: the job scripts stop at once, with exactly one line that says what to do,
#   * when run outside Slurm (bash run.sbatch);
#   * when the program is not built;
#   * when the data is not staged (the line names the login-node download script);
#   * when more tasks per node are requested than the node has GPUs;
#   * when KIT_SITE names no site profile;
# each of these before srun starts a trainer; and
#   * a trainer built against a CPU-only LibTorch stops at setup() with one line in a job with
#     GPUs, unless KIT_ALLOW_CPU=1 (which the local profile sets for the other tests).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

# one_line REGEX FILE: FILE holds exactly one line, and it matches REGEX.
one_line() {
  local re=$1 file=$2 n
  n=$(wc -l <"$file" 2>/dev/null || echo 0)
  if [ "$n" -eq 1 ] && grep -qE -- "$re" "$file"; then return 0; fi
  say "  expected one line matching /$re/ in $(basename "$file"), got $n line(s):"
  sed 's/^/  | /' "$file" 2>/dev/null
  return 1
}

no_trainer() {
  expect_count 0 '^(rank [0-9]+ of|training on|final test loss)' && ! grep -q '^srun' "$ERR"
}

# Outside Slurm: no cluster needed.
for script in run.sbatch solution.sbatch; do
  out=$(env -u SLURM_JOB_ID bash "$SBATCH_DIR/$script" 2>&1 >/dev/null)
  rc=$?
  printf '%s\n' "$out" >"${TMPDIR:-/tmp}/kit-failfast.$$"
  check "outside Slurm: $script exits 1" test "$rc" -eq 1
  check "outside Slurm: $script says so in one line" \
    one_line "^$script: error: not inside a Slurm job: submit it with 'sbatch " "${TMPDIR:-/tmp}/kit-failfast.$$"
  rm -f "${TMPDIR:-/tmp}/kit-failfast.$$"
done

boot_cluster
work=$CLUSTER/work

# failing_job NAME REGEX SCRIPT [SBATCH OPTIONS] [-- ARGS]: the job fails, with one line in .err.
failing_job() {
  local name=$1 re=$2
  shift 2
  submit "$work/$name" "$@"
  check "$name: job fails" expect_state FAILED
  check "$name: one clear line" one_line "$re" "$ERR"
  check "$name: no trainer started" no_trainer
}

JOB_BUILD=$CLUSTER/no-build failing_job not-built \
  '^ex01: error: .*/no-build/bin/ex01-exercise is not built: build it on the login node with .cmake --build ' \
  "$SBATCH_DIR/run.sbatch"
JOB_BUILD=$CLUSTER/no-build failing_job not-built-solution \
  '^ex01: error: .*/no-build/bin/ex01-solution is not built' "$SBATCH_DIR/solution.sbatch"

mkdir -p "$CLUSTER/empty-data"
JOB_DATA=$CLUSTER/empty-data failing_job no-data \
  "^ex01: error: the data is not staged: .*/empty-data/wiki\\.train\\.tokens is missing; .*on the login node run '.*/common/data/download_wikitext2\\.sh .*/empty-data'" \
  "$SBATCH_DIR/run.sbatch"

failing_job too-many-tasks \
  '^ex01: error: 8 tasks per node requested but only 4 GPU\(s\) per node' \
  "$SBATCH_DIR/solution.sbatch" --nodes=1 --ntasks-per-node=8
failing_job too-many-tasks-student \
  '^ex01: error: 2 tasks per node requested but only 1 GPU\(s\) per node' \
  "$SBATCH_DIR/run.sbatch" --ntasks-per-node=2

JOB_SITE=nowhere failing_job unknown-site \
  '^ex01: error: unknown site KIT_SITE=nowhere: no .*/sbatch/sites/nowhere\.sh \(known sites: .*generic.*local' \
  "$SBATCH_DIR/run.sbatch"

# A CPU-only build in a job with GPUs, without the KIT_ALLOW_CPU=1 of the local profile: the
# trainer stops at setup() with one line naming the build and the module to load; nothing trains.
KIT_ALLOW_CPU=0 submit "$work/cpu-build" "$SBATCH_DIR/solution.sbatch" --nodes=1 --gres=gpu:1
check "cpu-build: job fails" expect_state FAILED
check "cpu-build: the trainer's one line" expect_count 1 \
  '^rank 0: error: this program was built against a CPU-only LibTorch, but it runs in a Slurm job with GPUs \(SLURM_[A-Z_]+=[0-9,]+\): .*--allow-cpu' "$ERR"
check "cpu-build: nothing trained" expect_count 0 '^final test loss'
finish
