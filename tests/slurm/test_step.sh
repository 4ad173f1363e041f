#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions below run through check(), which shellcheck cannot see
# test_step.sh: sbatch/job.sh's kit_step, without a cluster. A batch shell runs
# `kit_step STEP` (STEP: a fake job step that saves a "checkpoint" and exits 0 on USR1, as the
# trainer does), with a fake scontrol that records what it is asked; the test signals the shell
# as Slurm would.
#   * no signal: the step's status, no requeue;
#   * USR1 (the time-limit warning): passed on to the step as USR1, the job requeues itself
#     (scontrol requeue <job id>) and the script ends with status 0, saying so in one line;
#   * USR1 after the training finished (a new model-final.pt): no requeue;
#   * TERM (scancel, preemption): passed on as USR1, no requeue;
#   * USR1 and a failing step: the step's status, no requeue;
#   * scontrol refuses, or the job was requeued KIT_MAX_REQUEUES times: one line on stderr that
#     says how to continue (KIT_OUT_DIR=<run folder>), exit 1.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/kit-step.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"

# The fake scontrol: `requeue ID` is recorded; FAKE_SCONTROL_FAILS=1 refuses.
cat >"$work/bin/scontrol" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$FAKE_LOG"
if [ "${FAKE_SCONTROL_FAILS:-0}" = 1 ]; then
  echo "scontrol: error: Job is not requeueable" >&2
  exit 1
fi
EOF
# The fake step: says it is ready, then works until USR1 arrives (recorded; at most 2 s), exits
# $STEP_RC.
# With STEP_FINISHES=1 it writes model-final.pt first, as a trainer that got the signal too late.
cat >"$work/step" <<'EOF'
#!/usr/bin/env bash
trap 'echo "step got USR1" >>"$FAKE_LOG"; stop=1' USR1
trap 'echo "step got TERM" >>"$FAKE_LOG"; exit 143' TERM
stop=
[ "${STEP_FINISHES:-0}" = 1 ] && : >"$KIT_OUT/model-final.pt"
: >"$FAKE_READY"
for _ in $(seq 40); do
  [ -n "$stop" ] && exit "${STEP_RC:-0}"
  sleep 0.05
done
echo "step never got a signal" >>"$FAKE_LOG"
exit "${STEP_RC:-0}"
EOF
chmod +x "$work/bin/scontrol" "$work/step"

# batch SIGNAL [VAR=VALUE...]: a batch shell runs `kit_step STEP; echo after the step: $?`; once
# the step is running it gets SIGNAL (none: "-"). Sets OUTPUT (stdout + stderr), STATUS, LOG.
batch() {
  local sig=$1 n pid
  shift
  local dir=$work/run-$RANDOM
  mkdir -p "$dir/out"
  export FAKE_LOG=$dir/log FAKE_READY=$dir/ready
  : >"$FAKE_LOG"
  env "$@" PATH="$work/bin:$PATH" KIT_ROOT="$ROOT" KIT_OUT="$dir/out" SLURM_JOB_ID=4242 \
    SLURM_JOB_NAME=ex01 bash -c "set -euo pipefail; . '$ROOT/sbatch/job.sh'
      kit_step '$work/step'; echo \"after the step: \$?\"" >"$dir/output" 2>&1 &
  pid=$!
  for ((n = 0; n < 100; n++)); do
    [ -e "$FAKE_READY" ] && break
    sleep 0.05
  done
  [ "$sig" = - ] || kill -s "$sig" "$pid"
  STATUS=0
  wait "$pid" || STATUS=$?
  OUTPUT=$(cat "$dir/output")
  LOG=$(cat "$FAKE_LOG")
}

# expect WHAT GOT WANT
expect() {
  [ "$2" = "$3" ] && return 0
  say "  $1: got '$2', expected '$3'"
  say "  output: $OUTPUT"
  say "  log: $LOG"
  return 1
}

no_signal() {
  batch -
  expect status "$STATUS" 0 && expect output "$OUTPUT" "after the step: 0" &&
    expect log "$LOG" "step never got a signal"
}
check "no signal: the step's status, no requeue" no_signal

usr1_requeues() {
  batch USR1
  expect status "$STATUS" 0 &&
    expect output "$OUTPUT" "ex01: SIGUSR1 (the time limit is near): the training saves a checkpoint and stops
ex01: requeuing job 4242 (restart 1): the next run continues from the checkpoint in ${FAKE_LOG%/log}/out" &&
    expect log "$LOG" "step got USR1
requeue 4242"
}
check "USR1: passed on, job requeued, script ends" usr1_requeues

restart_count() {
  batch USR1 SLURM_RESTART_COUNT=3
  expect status "$STATUS" 0 || return 1
  [[ $OUTPUT == *"requeuing job 4242 (restart 4)"* ]] && return 0
  say "  output: $OUTPUT"
  return 1
}
check "USR1 in restart 3: restart 4" restart_count

finished_no_requeue() {
  batch USR1 STEP_FINISHES=1
  expect status "$STATUS" 0 &&
    expect output "$OUTPUT" "ex01: SIGUSR1 (the time limit is near): the training saves a checkpoint and stops
after the step: 0" && expect log "$LOG" "step got USR1"
}
check "USR1 after the training finished: no requeue" finished_no_requeue

term_no_requeue() {
  batch TERM
  expect status "$STATUS" 0 &&
    expect output "$OUTPUT" "ex01: SIGTERM (job cancelled or preempted): the training saves a checkpoint and stops
after the step: 0" && expect log "$LOG" "step got USR1"
}
check "TERM: passed on as USR1, no requeue" term_no_requeue

failing_step() {
  batch USR1 STEP_RC=3
  # set -e: the failing step ends the script with its status.
  expect status "$STATUS" 3 &&
    expect output "$OUTPUT" "ex01: SIGUSR1 (the time limit is near): the training saves a checkpoint and stops" &&
    expect log "$LOG" "step got USR1"
}
check "USR1 and a failing step: its status, no requeue" failing_step

requeue_refused() {
  batch USR1 FAKE_SCONTROL_FAILS=1
  expect status "$STATUS" 1 &&
    expect output "$OUTPUT" "ex01: SIGUSR1 (the time limit is near): the training saves a checkpoint and stops
ex01: requeuing job 4242 (restart 1): the next run continues from the checkpoint in ${FAKE_LOG%/log}/out
ex01: error: the training stopped at a checkpoint before the time limit, but 'scontrol requeue 4242' failed (scontrol: error: Job is not requeueable): submit again with KIT_OUT_DIR=${FAKE_LOG%/log}/out to continue from it"
}
check "requeue refused: one line, how to continue, exit 1" requeue_refused

too_many() {
  batch USR1 SLURM_RESTART_COUNT=2 KIT_MAX_REQUEUES=2
  expect status "$STATUS" 1 &&
    expect output "$OUTPUT" "ex01: SIGUSR1 (the time limit is near): the training saves a checkpoint and stops
ex01: error: the training stopped at a checkpoint before the time limit, but this job was requeued 2 times already (KIT_MAX_REQUEUES=2): submit again with KIT_OUT_DIR=${FAKE_LOG%/log}/out to continue from it" &&
    expect log "$LOG" "step got USR1"
}
check "KIT_MAX_REQUEUES reached: one line, exit 1" too_many
finish
