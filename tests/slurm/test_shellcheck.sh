#!/usr/bin/env bash
# test_shellcheck.sh: shellcheck passes on every script of sbatch/ and tests/slurm/, on the
# generated run.sbatch and solution.sbatch, and on the job script of every stage (0 to the last).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

command -v shellcheck >/dev/null || { say "shellcheck is not installed (apt-get install shellcheck)"; exit 1; }

stages=$(mktemp -d "${TMPDIR:-/tmp}/kit-stages.XXXXXX")
trap 'rm -rf "$stages"' EXIT
last=$(python3 "$ROOT/common/tools/stages.py" count 01-transformer-lm-ddp run.sbatch) ||
  { say "stages.py count failed"; exit 1; }
for ((k = 0; k <= last; k++)); do
  python3 "$ROOT/common/tools/stages.py" stage 01-transformer-lm-ddp "$k" "$stages/stage-$k" ||
    { check "stage $k renders" false; continue; }
done

# The rendered stages source ../job.sh relative to their own folder: give them one.
ln -s "$ROOT/sbatch/job.sh" "$stages/job.sh"
ln -s "$ROOT/sbatch/sites" "$stages/sites"

cd "$ROOT" || exit 1
files=(sbatch/*.sh sbatch/sites/*.sh sbatch/*/*.sbatch tests/slurm/*.sh)
for f in "${files[@]}"; do
  check "shellcheck $f" shellcheck -x "$f"
done
for ((k = 0; k <= last; k++)); do
  check "shellcheck run.sbatch of stage $k" shellcheck -x "$stages/stage-$k/run.sbatch"
done
finish
