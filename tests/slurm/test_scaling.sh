#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_scaling.sh: exercise 02's scaling study (sbatch/02-resnet-cifar10-ddp/scaling.sbatch) as
# one job on the test cluster (2 nodes x 4 fake GPUs), with tiny sizes: strong and weak scaling
# on 1, 2 and 8 GPUs, the 8 spread over both nodes.
#   * the job completes, and runs one srun step per (mode, GPU count), each with --preset gpu
#     (the test's own flags after it win over its sizes);
#   * scaling.csv holds one row per run, from the trainer's --summary-csv: the labels, the world
#     sizes, the nodes (8 GPUs = 2 nodes), the batches (strong: global 16 split over the GPUs;
#     weak: 4 per GPU);
#   * plot_scaling.py draws the CSV: four plots and the summary table, one row per run.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

IMAGES=${KIT_TEST_IMAGES:-$BUILD/data/cifar-10}
NEEDS=("$BUILD/bin/ex02-solution" "$BUILD/bin/ddprun" "$IMAGES/data_batch_1.bin")
boot_cluster
work=$CLUSTER/work

export KIT_STUDY_GPUS="1 2 8" KIT_STUDY_GLOBAL_BATCH=16 KIT_STUDY_BATCH=4
JOB_DATA=$IMAGES submit "$work/job" "$ROOT/sbatch/02-resnet-cifar10-ddp/scaling.sbatch" -- \
  --max-steps 3 --width 4 --blocks 1 --train-images 128 --test-images 32 --target-acc 0.01
csv=$work/job/runs/ex02-scaling-$JOB/scaling.csv
check "job completes" expect_state COMPLETED
check "no error in the .err file" expect_count 0 'error' "$ERR"
check "one step per mode and GPU count" expect_count 6 '^ex02-scaling: run (strong|weak)-[128]: '
check "8 GPUs run on 2 nodes" expect_count 1 '^ex02-scaling: run weak-8: 8 GPU\(s\) on 2 node\(s\)'
# The study's runs take the GPU preset (--preset gpu first, the flags above win over its sizes).
check "the runs take the GPU preset" expect_count 1 '^ex02-scaling: study: .*, preset gpu$'

# expect_rows: label world_size nodes batch_per_rank global_batch, one line per run, in order.
expect_rows() {
  local got want
  got=$(awk -F, 'NR > 1 { print $1, $2, $3, $4, $5 }' "$csv" 2>/dev/null)
  want=$(printf '%s\n' "strong-1 1 1 16 16" "strong-2 2 1 8 16" "strong-8 8 2 2 16" \
                       "weak-1 1 1 4 4" "weak-2 2 1 4 8" "weak-8 8 2 4 32")
  [ "$got" = "$want" ] && return 0
  say "  $csv has:"; say "$got"; say "  expected:"; say "$want"
  return 1
}
check "scaling.csv: one row per run, with its ranks, nodes and batches" expect_rows
expect_positive_rates() {
  [ "$(awk -F, 'NR > 1 && $10 > 0 && $11 > 0' "$csv" | wc -l)" -eq 6 ] && return 0
  say "  not every run has images/s > 0"; return 1
}
check "every run measured its images/s" expect_positive_rates

plots=$work/plots
python3 "$ROOT/slides/tools/plot_scaling.py" --out "$plots" --label "test cluster" "$csv" > /dev/null
expect_plots() {
  local f
  for f in throughput speedup efficiency time-to-target; do
    grep -q '<circle' "$plots/scaling-$f.svg" 2>/dev/null || { say "  no scaling-$f.svg with marks"; return 1; }
  done
  expect_count 6 '^\| (strong|weak) \| [128] \|' "$plots/scaling-summary.md"
}
check "plot_scaling.py draws the study" expect_plots
[ "$FAILED" -eq 0 ] || show
finish
