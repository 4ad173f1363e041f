#!/bin/bash
# Smoke test of the DDP benchmark (not a timing test): 2 ranks on the CPU (also on a GPU node),
# 2 timed steps at 2 sequences per rank, and rank 0 must print exactly one well-formed BENCH line
# in which the gradients were all-reduced (reduce_bytes > 0).
#   usage: smoke_test.sh DDPRUN BENCH_DDP [CORPUS_DIR]
set -u
ddprun=$1 bench=$2 data=${3:-}
out=$(OMP_NUM_THREADS=1 "$ddprun" --nproc-per-node 2 -- "$bench" --steps 2 --warmup 1 --batch 2 \
      --device cpu ${data:+--data "$data"} --name smoke 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit code $rc"; exit 1; }
n=$(printf '%s\n' "$out" | grep -c '^BENCH ')
[ "$n" -eq 1 ] || { echo "FAIL: $n BENCH lines, expected 1 (rank 0 only)"; exit 1; }
num='[0-9]+(\.[0-9]+)?'
re="^BENCH impl=cpp name=smoke device=cpu ranks=2 threads=1 ddp=1 overlap=1 steps=2 warmup=1 batch=2 seq_len=[0-9]+ vocab=[0-9]+ params=[0-9]+ buckets=$num(,$num)* step_ms_median=$num step_ms_min=$num fwd_ms_median=$num bwd_ms_median=$num opt_ms_median=$num wait_ms_median=$num tail_ms_median=$num cpu_ms_median=$num samples_per_s=$num loss_mean=$num copy_ms_median=$num reduce_ms_median=$num reduce_bytes=[1-9][0-9]* loopback_ms_median=$num loopback_mb_per_s=$num\$"
printf '%s\n' "$out" | grep -Eq "$re" || { echo "FAIL: malformed BENCH line (expected /$re/)"; exit 1; }
echo "OK"
