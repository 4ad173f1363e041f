#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_stages.sh: the student's job script, as shipped and at every stage of TODOs 14-17.
#   * as shipped (run.sbatch, your build of the exercise): one GPU, one process, single-device
#     training ("training on ...", no ranks);
#   * stage 14: 4 GPUs requested and visible, but still 1 rank;
#   * stage 15: MASTER_ADDR is the first node, MASTER_PORT = 20000 + job id % 10000; still 1 rank;
#   * stage 16: 4 ranks on one node;
#   * stage 17: 8 ranks on two nodes (local ranks 0-3 on each).
# The stage scripts are rendered by common/tools/stages.py, as CMake renders the C++ stages.
# From stage 14 on every C++ TODO is done, so they run the solution's build (KIT_PROGRAM).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

boot_cluster
work=$CLUSTER/work

# As shipped.
submit "$work/shipped" "$SBATCH_DIR/run.sbatch" -- "${QUICK[@]}"
check "as shipped: job completes" expect_state COMPLETED
check "as shipped: runs the exercise build" expect_count 1 '^ex01: program: .*/bin/ex01-exercise$'
check "as shipped: 1 GPU" expect_count 1 '^ex01: GPUs per node: 1 allocated, CUDA_VISIBLE_DEVICES=0$'
check "as shipped: single-device training" expect_count 1 '^training on [a-z0-9:]+$'
check "as shipped: no ranks" expect_count 0 '^rank [0-9]+ of '
check "as shipped: one final loss" expect_count 1 '^final test loss '
[ "$FAILED" -eq 0 ] || show

# rank_count N NODES: the job ran N ranks and printed rank 0's lines once.
stage_ok() {
  local world=$1 nodes=$2 ok=0
  expect_state COMPLETED || ok=1
  expect_count 1 "^ex01: job $JOB on $nodes node\\(s\\) " || ok=1
  expect_ranks "$world" || ok=1
  expect_rank0_once || ok=1
  return "$ok"
}

for k in 14 15 16 17; do
  dir=$work/stage-$k
  mkdir -p "$dir"
  python3 "$ROOT/common/tools/stages.py" stage 01-transformer-lm-ddp "$k" "$dir/script" ||
    { check "stage $k renders" false; continue; }
  before=$FAILED
  KIT_PROGRAM=$BUILD/bin/ex01-solution submit "$dir/job" "$dir/script/run.sbatch" -- "${QUICK[@]}"
  case $k in
    14)
      check "stage 14: 1 rank on 1 node" stage_ok 1 1
      check "stage 14: 4 GPUs visible" \
        expect_count 1 '^ex01: GPUs per node: 4 allocated, CUDA_VISIBLE_DEVICES=0,1,2,3$'
      check "stage 14: no rendezvous yet" \
        expect_count 1 '^ex01: rendezvous: MASTER_ADDR=\(unset\) MASTER_PORT=\(unset\)$'
      ;;
    15)
      check "stage 15: 1 rank on 1 node" stage_ok 1 1
      check "stage 15: MASTER_ADDR and the job's port" \
        expect_count 1 "^ex01: rendezvous: MASTER_ADDR=kitn1 MASTER_PORT=$((20000 + JOB % 10000))\$"
      ;;
    16)
      check "stage 16: 4 ranks on 1 node" stage_ok 4 1
      ;;
    17)
      check "stage 17: 8 ranks on 2 nodes" stage_ok 8 2
      check "stage 17: 4 GPUs visible per node" \
        expect_count 1 '^ex01: GPUs per node: 4 allocated, CUDA_VISIBLE_DEVICES=0,1,2,3$'
      ;;
  esac
  [ "$FAILED" -eq "$before" ] || show
done
finish
