#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_ex07.sh: the capstone's solution.sbatch on the test cluster as shipped (2 nodes x 4 fake
# GPUs, 8 ranks):
#   * without prepared data (a folder with no xsum.h5) the job stops at once, before srun: FAILED,
#     one line in the .err file naming `kit data xsum DIR` on the login node and XSUM_DIR, and no
#     rank started;
#   * with the generated corpus, prepared as a participant prepares XSum (./kit data xsum generate,
#     then prepare: the sizes of common/tools/rules/ex07.py), the job completes, every rank's
#     "rank R of 8" line is there once (4 per node), rank 0's numbers once, and the final test
#     loss and ROUGE equal those of the same training on this machine without Slurm (ddprun, 8
#     ranks);
#   * ./kit check 07 --job fails the shipped run.sbatch on TODO 7 (the whole job script).
# A build without HDF5 has no exercise 07 (CMakeLists.txt): skipped then.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

case ${KIT_HAVE_HDF5:-1} in
  0 | OFF | FALSE | NO | '')
    say "skipped: this build has no HDF5, so no exercise 07 (CMakeLists.txt)"
    exit 77 ;;
esac
NEEDS=("$BUILD/bin/ex07-solution" "$BUILD/bin/ddprun")
boot_cluster
work=$CLUSTER/work
SCRIPT=$ROOT/sbatch/07-xsum-summariser/solution.sbatch
# A small model on few examples, one rank's 4 examples a step for 3 steps: the job's shape and
# numbers are what is tested, not the summaries (8 ranks share the machine's cores).
FLAGS=(--epochs 1 --max-steps 3 --batch-size 4 --eval-batch-size 8 --train-examples 96
       --eval-examples 24 --max-document-len 48 --max-summary-len 12 --d-model 32 --heads 2
       --encoder-layers 1 --decoder-layers 1 --feedforward 64 --show 0 --seed 7)

# (a) No prepared data: the folder exists (the download ran, say) but holds no xsum.h5.
mkdir -p "$work/no-data"
started=$SECONDS
JOB_DATA=$work/no-data submit "$work/nodata" "$SCRIPT" -- "${FLAGS[@]}"
took=$((SECONDS - started))
check "without xsum.h5 the job fails" expect_state FAILED
expect_one_line() {
  local lines
  lines=$(grep -c . "$ERR" 2>/dev/null || true)
  [ "$lines" -eq 1 ] || { say "  $(basename "$ERR") has $lines line(s), expected 1"; return 1; }
  expect_count 1 "^ex07: error: the data is not prepared: $work/no-data/xsum\\.h5 is missing; .*on the login node run '[^']*kit data xsum $work/no-data' .*XSUM_DIR" "$ERR"
}
check "one line in .err: the login node's ./kit data xsum, XSUM_DIR" expect_one_line
check "no rank started (it stops before srun)" expect_count 0 '^rank [0-9]+ of '
quick() { [ "$took" -le 15 ] || { say "  the job took $took s to fail"; return 1; }; }
check "it fails at once ($took s)" quick
[ "$FAILED" -eq 0 ] || show

# (b) The generated corpus, prepared on the "login node" (here: this machine, before sbatch).
xsum=$work/xsum
if ! "$ROOT/kit" data xsum generate "$xsum" --train 200 --validation 40 --test 40 --seed 3 \
       >"$work/xsum.log" 2>&1 ||
   ! "$ROOT/kit" data xsum prepare "$xsum" --vocab-size 1000 >>"$work/xsum.log" 2>&1; then
  say "FAIL the generated XSum corpus could not be prepared:"
  cat "$work/xsum.log"
  exit 1
fi
JOB_DATA=$xsum submit "$work/solution" "$SCRIPT" -- "${FLAGS[@]}"
check "2 x 4 job completes" expect_state COMPLETED
check "8 ranks on 2 nodes, local rank = rank % 4" expect_ranks 8 4
check "rank 0's numbers once" expect_once \
  '^\[1/1\] train loss [0-9.]+, validation loss [0-9.]+, ROUGE-1 [0-9.]+, ROUGE-2 [0-9.]+, ROUGE-L [0-9.]+$' \
  '^final test loss [0-9.]+, ROUGE-1 [0-9.]+, ROUGE-2 [0-9.]+, ROUGE-L [0-9.]+$'

slurm_line=$(final_loss "$OUT")
DATA=$xsum
local_line=$(ddprun_loss 8 "$work/ddprun" "$BUILD/bin/ex07-solution" "${FLAGS[@]}")
# rules/ex07.py's tolerance for printed numbers (LOSS_TOL, 2 units of the last digit): the same
# training on the same 8 ranks, only launched by srun instead of ddprun.
same_numbers() {
  local a b i ok=0
  read -r -a a <<<"$(grep -oE '[0-9]+\.[0-9]+' <<<"$slurm_line" | tr '\n' ' ')"
  read -r -a b <<<"$(grep -oE '[0-9]+\.[0-9]+' <<<"$local_line" | tr '\n' ' ')"
  [ "${#a[@]}" -eq 4 ] && [ "${#b[@]}" -eq 4 ] || ok=1
  for ((i = 0; ok == 0 && i < 4; i++)); do
    awk -v a="${a[i]}" -v b="${b[i]}" 'BEGIN { d = a - b; exit !(d <= 2e-5 && d >= -2e-5) }' || ok=1
  done
  [ "$ok" -eq 0 ] && return 0
  say "  Slurm (2 nodes x 4): '$slurm_line'"
  say "  ddprun (8 ranks):    '$local_line'"
  return 1
}
check "final test loss and ROUGE equal ddprun's with 8 ranks" same_numbers
say "  Slurm: $slurm_line; ddprun: $local_line"

# ./kit check 07 --job (info.toml's [check.job]: every judgment of the job script is a row of
# TODO 7) on the job script as shipped: one GPU, one task, one node, no rendezvous fail TODO 7,
# and its jobs still run the [check.job] flags on the prepared data to the end ("all"). The
# solution passing it (passed: 7,all) is left out here: two more jobs of 8 and 4 ranks, 25 s.
check "kit check 07 --job: the shipped run.sbatch fails TODO 7" \
  expect_job 07-xsum-summariser "$ROOT/sbatch/07-xsum-summariser/run.sbatch" all 7
[ "$FAILED" -eq 0 ] || show
finish
