#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_ex02.sh: exercise 02's solution job script on the test cluster (2 nodes x 4 fake GPUs),
# one short job on the generated image set:
#   * the job completes, with 8 ranks on 2 nodes, local rank = rank % 4;
#   * the CIFAR-10 folder is the one the job was given (kit_job_init --cifar10);
#   * rank 0's lines (the epoch, the final test loss and accuracy) appear exactly once;
#   * nothing on the .err file.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

IMAGES=${KIT_TEST_IMAGES:-$BUILD/data/cifar-10}
NEEDS=("$BUILD/bin/ex02-solution" "$IMAGES/data_batch_1.bin")
boot_cluster
work=$CLUSTER/work

JOB_DATA=$IMAGES submit "$work/job" "$ROOT/sbatch/02-resnet-cifar10-ddp/solution.sbatch" -- \
  --epochs 1 --max-steps 2 --train-images 200 --test-images 80
check "job completes" expect_state COMPLETED
check "8 ranks on 2 nodes, local rank = rank % 4" expect_ranks 8 4
check "the job reads the CIFAR-10 folder it was given" expect_count 1 "^ex02: data: $IMAGES, output: "
check "rank 0's lines appear once" expect_once \
  '^\[1/1\] train loss [0-9.]+, test loss [0-9.]+, test accuracy [0-9.]+$' \
  '^final test loss [0-9.]+, test accuracy [0-9.]+$'
check "no error in the .err file" expect_count 0 'error' "$ERR"
[ "$FAILED" -eq 0 ] || show
finish
