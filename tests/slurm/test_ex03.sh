#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_ex03.sh: exercise 03's solution.sbatch on the test cluster (2 nodes x 4 fake GPUs) with
# --zero-stage 3 passed through to the trainer: 8 ranks on 2 nodes train, rank 0's losses appear
# once, and every rank holds its 1/8 of each unit's weights (4 x the sum of ceil(unit / 8)
# bytes, the unit sizes read from the job's "parameters ... in units ..." line).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

NEEDS=("$BUILD/bin/ex03-solution" "$DATA/wiki.train.tokens")
boot_cluster
work=$CLUSTER/work

submit "$work/solution" "$ROOT/sbatch/03-transformer-lm-zero/solution.sbatch" -- \
  "${QUICK[@]}" --zero-stage 3
check "ZeRO-3 job completes" expect_state COMPLETED
check "8 ranks on 2 nodes, local rank = rank % 4" expect_ranks 8 4
check "rank 0's losses once" expect_rank0_once
expect_shards() {
  local params r ok=0
  params=$(sed -n 's/^parameters [0-9]* in units\(.*\) on 8 ranks$/\1/p' "$OUT" |
    awk '{ s = 0; for (i = 1; i <= NF; i++) s += int(($i + 7) / 8); print 4 * s }')
  [ -n "$params" ] || { say "  no \"parameters ... in units ... on 8 ranks\" line"; return 1; }
  for ((r = 0; r < 8; r++)); do
    expect_count 1 "^rank $r: ZeRO-3 holds params $params grads $params optimizer $((2 * params)) " || ok=1
  done
  return "$ok"
}
check "every rank holds 1/8 of every unit (the formula)" expect_shards
[ "$FAILED" -eq 0 ] || show
finish
