#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_check_interactive.sh: ./kit check in an interactive allocation of the test cluster (salloc,
# then a step as `srun --pty` gives one: 4 fake GPUs, Slurm's GPU variables set), with the CPU
# build the test cluster has.
#   * the check says in one line that its runs train on the CPU with Gloo because the build has
#     no CUDA, and judges exercise 00's solution as it does outside Slurm: every TODO passes;
#   * its runs get KIT_ALLOW_CPU=1 from the check: the same trainer started in that step by hand
#     stops with the one line of a CPU-only build in a job with GPUs.
# (A CUDA build's placement, a GPU per rank or the CPU when there are fewer GPUs than ranks, is
# kit.check_allocation's: the test cluster's GPUs are device files.)
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

NEEDS=("$BUILD/bin/ex00-solution" "$BUILD/bin/ddprun")
boot_cluster
work=$CLUSTER/work
mkdir -p "$work"

# in_step CMD...: CMD in a step of a fresh one-node allocation with 4 GPUs.
in_step() {
  (cd "$work" && timeout 600 salloc --nodes=1 --gres=gpu:4 --quiet \
    srun --nodes=1 --ntasks=1 --gres=gpu:4 "$@")
}
out=$work/check.out
in_step python3 "$ROOT/common/tools/check.py" --exercise 00-collectives \
  --binary "$BUILD/bin/ex00-solution" --solution "$BUILD/bin/ex00-solution" \
  --bin-dir "$BUILD/bin" --source "$ROOT/solutions/00-collectives/collectives.cpp" >"$out" 2>&1
rc=$?
OUT=$out
check "the check passes in the allocation" test "$rc" -eq 0
check "one line says where its runs train, and why" expect_count 1 \
  "^check: Slurm job [0-9]+ with 4 GPU\\(s\\) here \\(0,1,2,3\\), but this build's LibTorch has no CUDA: the runs train on the CPU with Gloo"
check "no TODO fails" expect_count 0 '✘'
check "every TODO was judged" expect_count 1 '^failed: -$'

OUT=$work/by-hand.out
in_step "$BUILD/bin/ex00-solution" >"$OUT" 2>&1
check "by hand in the same step: the CPU build stops with one line" expect_count 1 \
  'error: this program was built against a CPU-only LibTorch, but it runs in a Slurm job with GPUs \(SLURM_STEP_GPUS=0,1,2,3\)'
[ "$FAILED" -eq 0 ] || { cat "$work/check.out"; cat "$OUT"; }
finish
