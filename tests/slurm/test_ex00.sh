#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_ex00.sh: exercise 00's job scripts on the test cluster (2 nodes x 4 fake GPUs), the
# course's first submission.
#   * solution.sbatch as shipped: one node (a class of thirty must not hold two nodes each for
#     a one-second program), 4 ranks;
#   * solution.sbatch --nodes=2, the optional step the script's comment offers: 8 ranks on 2
#     nodes, local rank = rank % 4;
#   * in both, every rank says who it is, every rank's all_reduce SUM and reduce_scatter are
#     their closed forms for the job's ranks, and every rank left the barrier after all had
#     arrived (their marks are in the job's run folder, which both nodes see);
#   * run.sbatch as shipped runs the unmodified exercise on one node: 4 processes, each alone.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

NEEDS=("$BUILD/bin/ex00-solution" "$BUILD/bin/ex00-exercise")
boot_cluster
work=$CLUSTER/work
dir=$ROOT/sbatch/00-collectives

# expect_results W: with W ranks, 1 + 2 + ... + W = S; rank r's chunk is (r + 1) x S x [1, 2].
expect_results() {
  local w=$1 s=$(($1 * ($1 + 1) / 2)) r ok=0
  expect_count "$w" "^rank [0-9]+: all_reduce SUM $s $((2 * s))\$" || ok=1
  for ((r = 0; r < w; r++)); do
    expect_count 1 "^rank $r: reduce_scatter $((s * (r + 1))) $((2 * s * (r + 1)))\$" || ok=1
  done
  return "$ok"
}

# solution_job NODES [SBATCH OPTIONS...]: the solution on NODES nodes of 4 GPUs, 4 x NODES ranks.
solution_job() {
  local nodes=$1 w=$(($1 * 4))
  shift
  submit "$work/solution-$nodes" "$dir/solution.sbatch" "$@" -- --elements 2
  check "solution job on $nodes node(s) completes" expect_state COMPLETED
  check "no data needed, no error in the .err file" expect_count 0 'error' "$ERR"
  check "the job ran on $nodes node(s)" expect_count 1 "^ex00: job $JOB on $nodes node\\(s\\) "
  check "$w ranks, local rank = rank % 4" expect_ranks "$w" 4
  check "all_reduce and reduce_scatter over $w ranks" expect_results "$w"
  check "every rank left the barrier after all had arrived" \
    expect_count "$w" "^rank [0-9]+: after the barrier $w of $w ranks had arrived\$"
  [ "$FAILED" -eq 0 ] || show
}
solution_job 1            # as shipped
solution_job 2 --nodes=2  # the optional second step

submit "$work/exercise" "$dir/run.sbatch"
check "exercise job completes" expect_state COMPLETED
check "the exercise runs on one node" expect_count 1 "^ex00: job $JOB on 1 node\\(s\\) "
check "the unmodified exercise: 4 processes, each alone" expect_count 4 '^running alone on cpu$'
[ "$FAILED" -eq 0 ] || show
finish
