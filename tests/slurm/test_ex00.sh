#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_ex00.sh: exercise 00's job scripts on the test cluster (2 nodes x 4 fake GPUs), the
# course's first submission.
#   * solution.sbatch as shipped: 8 ranks on 2 nodes; every rank says who it is (local rank =
#     rank % 4), every rank's all_reduce SUM and reduce_scatter are their closed forms for 8
#     ranks, and every rank left the barrier after all 8 had arrived (their marks are in the
#     job's run folder, which both nodes see);
#   * run.sbatch as shipped runs the unmodified exercise: 8 processes, each alone.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

NEEDS=("$BUILD/bin/ex00-solution" "$BUILD/bin/ex00-exercise")
boot_cluster
work=$CLUSTER/work
dir=$ROOT/sbatch/00-collectives

submit "$work/solution" "$dir/solution.sbatch" -- --elements 2
check "solution job completes" expect_state COMPLETED
check "no data needed, no error in the .err file" expect_count 0 'error' "$ERR"
check "8 ranks on 2 nodes, local rank = rank % 4" expect_ranks 8 4
# 1 + 2 + ... + 8 = 36; rank r's chunk is (r + 1) x 36 x [1, 2].
expect_results() {
  local r ok=0
  expect_count 8 '^rank [0-7]: all_reduce SUM 36 72$' || ok=1
  for ((r = 0; r < 8; r++)); do
    expect_count 1 "^rank $r: reduce_scatter $((36 * (r + 1))) $((72 * (r + 1)))\$" || ok=1
  done
  return "$ok"
}
check "all_reduce and reduce_scatter over 8 ranks" expect_results
check "every rank left the barrier after all had arrived" \
  expect_count 8 '^rank [0-7]: after the barrier 8 of 8 ranks had arrived$'
[ "$FAILED" -eq 0 ] || show

submit "$work/exercise" "$dir/run.sbatch"
check "exercise job completes" expect_state COMPLETED
check "the unmodified exercise: 8 processes, each alone" expect_count 8 '^running alone on cpu$'
[ "$FAILED" -eq 0 ] || show
finish
