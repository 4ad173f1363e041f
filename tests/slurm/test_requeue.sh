#!/usr/bin/env bash
# shellcheck disable=SC2317  # the expect_* functions run through check(), which shellcheck cannot see
# test_requeue.sh: a training longer than its job's time limit, on the test cluster. The solution
# job script on 1 node x 2 GPUs with `--time=1 --signal=B:USR1@50` (Slurm's shortest limit, and a
# warning 50 s before it), training for about a minute:
#   * Slurm's warning reaches the batch shell, which passes it on; the trainer stops after a step
#     and writes a checkpoint; the job requeues itself; every later run resumes from the newest
#     checkpoint (once or more: Slurm checks time limits only every 30 s or so);
#   * the job ends COMPLETED, with one final loss, equal to that of the same training without
#     interruption (ddprun, 2 ranks), and metrics.csv holds every step once with the same losses
#     (bit for bit, %.9g);
#   * nothing in the .err file but Slurm's own "CANCELLED ... DUE TO JOB REQUEUE" lines.
# Timing: the training is paced to ~1.1 s a step by KIT_TEST_STEP_DELAY_MS of the preloaded test
# hooks (common/testing/checkpoint_hooks_env.cpp; the numbers do not change), so that it outlasts
# the first warning. Slurm holds a requeued job for 120 s (cred_expire) before it may start again;
# the test moves its start time to now each time (what an idle queue would do anyway), so that the
# test takes 1.5-2.5 minutes instead of 5-7.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

boot_cluster
work=$CLUSTER/work
mkdir -p "$work"
# 4 epochs of 12 steps: 48 steps, ~55 s at 1.1 s a step.
flags=(--epochs 4 --max-steps 12 --d-model 32 --layers 1 --seq-len 16)

# A requeued job waits with Reason=BeginTime: release it at once. Runs until the test ends, and
# notes every state and reason it sees (shown when a check fails).
release_requeued() {
  local id state reason seen=
  while :; do
    while read -r id state reason; do
      [ "$id $state $reason" = "$seen" ] || say "$(date +%T) job $id: $state ($reason)"
      seen="$id $state $reason"
      [ "$reason" = BeginTime ] && scontrol update JobId="$id" StartTime=now 2>/dev/null
    done < <(squeue -h -o '%i %T %r' 2>/dev/null)
    sleep 0.5
  done >"$work/states.txt"
}
release_requeued &
releaser=$!
trap 'kill "$releaser" 2>/dev/null; stop_cluster' EXIT

LD_PRELOAD=$BUILD/lib/libkit_test_hooks.so KIT_TEST_STEP_DELAY_MS=1100 JOB_TIMEOUT=200 submit "$work/job" "$SBATCH_DIR/solution.sbatch" \
  --nodes=1 --gres=gpu:2 --time=1 --signal=B:USR1@50 -- "${flags[@]}"
kill "$releaser" 2>/dev/null
run=$work/job/runs/ex01-$JOB

# The uninterrupted training: the same flags on 2 local ranks.
mkdir -p "$work/ddprun/out"
"$BUILD/bin/ddprun" --nproc-per-node 2 -- "$BUILD/bin/ex01-solution" --data-dir "$DATA" \
  --out-dir "$work/ddprun/out" "${flags[@]}" >"$work/ddprun/out.txt" 2>"$work/ddprun/err.txt"

requeues=$(count_lines "$OUT" "^ex01: requeuing job $JOB \\(restart [0-9]+\\)")
say "the job was requeued $requeues time(s)"

# A warning may also reach the last run after its last step, while it evaluates and saves the
# final model: that run finishes, and rightly neither stops nor requeues. Slurm checks time
# limits every 30 s or so, so whether that happens depends on the timing; both are correct.
WARNING='^ex01: SIGUSR1 \(the time limit is near\): the training saves a checkpoint and stops$'
warnings_match_requeues() {
  local warnings late
  warnings=$(count_lines "$OUT" "$WARNING")
  [ "$warnings" -eq "$requeues" ] && return 0
  # The one extra warning: after the last run's start, and no "stopping after" line after it.
  late=$(re=$WARNING awk '/^ex01: job [0-9]+ on / { w = 0 } $0 ~ ENVIRON["re"] { w = 1 }
                          /^stopping after step / { w = 0 } END { print w + 0 }' "$OUT")
  [ "$warnings" -eq $((requeues + 1)) ] && [ "$late" = 1 ] && return 0
  say "  $warnings warning line(s) for $requeues requeue(s) (one more is allowed only in the" \
    "last run, after its last step)"
  return 1
}

warned_and_requeued() {
  local ok=0
  [ "$requeues" -ge 1 ] || { say "  the job never requeued itself"; ok=1; }
  warnings_match_requeues || ok=1
  expect_count "$requeues" '^stopping after step [0-9]+: checkpoint .* written; run the same command again to continue$' || ok=1
  return "$ok"
}

resumed_each_time() {
  local ok=0 r stop resume
  expect_count "$requeues" "^ex01: restart [0-9]+ of this job: the trainer continues from" || ok=1
  expect_count "$requeues" "^resuming from $run/checkpoints/step-[0-9]+: epoch [0-9]+, step [0-9]+\$" || ok=1
  # Each run resumes from the very checkpoint the run before it wrote when it stopped.
  for ((r = 1; r <= requeues; r++)); do
    stop=$(grep -E '^stopping after step ' "$OUT" | sed -n "${r}p" | sed -E 's/^stopping after step ([0-9]+):.*/\1/')
    resume=$(grep -E '^resuming from ' "$OUT" | sed -n "${r}p" | sed -E 's/.*, step ([0-9]+)$/\1/')
    [ -n "$stop" ] && [ "$stop" = "$resume" ] && continue
    say "  run $r stopped after step '$stop', run $((r + 1)) resumed at step '$resume'"
    ok=1
  done
  return "$ok"
}

same_final_loss() {
  local slurm_loss local_loss
  slurm_loss=$(final_loss "$OUT")
  local_loss=$(final_loss "$work/ddprun/out.txt")
  [ -n "$slurm_loss" ] && [ "$slurm_loss" = "$local_loss" ] && return 0
  say "  Slurm: '$slurm_loss', ddprun: '$local_loss'"
  return 1
}

# step,loss of every step row of metrics.csv (column 7, rank, is empty; the per-rank rows at each
# epoch's end hold throughput and memory, which differ between any two runs)
losses() { tail -n +2 "$1/metrics.csv" 2>/dev/null | awk -F, '$7 == "" { print $1 "," $3 }'; }
same_losses() {
  local a b
  a=$(losses "$work/ddprun/out")
  b=$(losses "$run")
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(printf '%s\n' "$b" | wc -l)" -eq 48 ] && return 0
  say "  metrics.csv differs from the uninterrupted run's:"
  diff <(printf '%s\n' "$a") <(printf '%s\n' "$b") | head -n 10
  return 1
}

clean_err() {
  local other
  other=$(grep -vE '^slurmstepd(-[a-z0-9]+)?: error: \*\*\* JOB [0-9]+ ON [a-z0-9]+ CANCELLED AT .* DUE TO JOB REQUEUE \*\*\*$' "$ERR")
  [ -z "$other" ] && return 0
  say "  unexpected lines in $(basename "$ERR"):"
  printf '%s\n' "$other" | head -n 10
  return 1
}

check "job completes" expect_state COMPLETED
check "warned before the time limit, checkpointed, requeued" warned_and_requeued
check "every restart resumes from the checkpoint of the run before" resumed_each_time
check "rank 0's final line once" expect_count 1 '^final test loss [0-9.]+ \(perplexity [0-9.]+\)$'
check "final loss equals the uninterrupted run's (ddprun x 2)" same_final_loss
check "metrics.csv: every step once, the uninterrupted run's losses" same_losses
check "no error but Slurm's requeue notices" clean_err
if [ "$FAILED" -ne 0 ]; then
  show
  say "--- the job's states, as the test saw them"
  cat "$work/states.txt"
fi
finish
