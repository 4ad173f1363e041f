#!/usr/bin/env bash
# test_job_output_badinput.sh: `./kit check 01 --job-output` refuses what holds no job, without
# Slurm and without root: a missing folder, an empty folder, a folder of other files, a job id
# that left no output here, a file that is no job's output, no argument. Each refusal is one
# "kit: error:" line on stderr naming what was expected, exit 2, nothing on stdout, nothing
# written into the folder it was given.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# refused WHAT EXPECTED_TEXT CWD ARG...: one error line with EXPECTED_TEXT, exit 2, no stdout.
refused() {
  local what=$1 text=$2 cwd=$3 rc=0
  shift 3
  (cd "$cwd" && timeout 60 "$root/kit" check 01 "$@") >"$work/out" 2>"$work/err" || rc=$?
  if [ "$rc" -eq 2 ] && [ ! -s "$work/out" ] && [ "$(wc -l <"$work/err")" -eq 1 ] &&
     grep -q '^kit: error: ' "$work/err" && grep -qF -- "$text" "$work/err"; then
    echo "ok   $what: $(cat "$work/err")"
  else
    echo "FAIL $what (exit $rc, want 2 and one line with '$text'):"
    sed 's/^/     /' "$work/out" "$work/err"
    failed=1
  fi
}

mkdir -p "$work/empty" "$work/other/runs" "$work/cwd"
echo "not a job" >"$work/other/notes.txt"
echo "ex02: job 7 on 1 node(s) n1, site generic" >"$work/other/ex02-7.out"
refused "missing folder" "no folder $work/nope" "$work/cwd" --job-output "$work/nope"
refused "empty folder" "holds no job of exercise 01-transformer-lm-ddp: expected the ex01-<job id>.out" \
  "$work/cwd" --job-output "$work/empty"
refused "folder of other files (another exercise's job)" "holds no job" "$work/cwd" \
  --job-output "$work/other"
refused "job id with no output here" "job 4242 left no ex01-4242.out in $work/cwd" "$work/cwd" \
  --job-output 4242
refused "a file that is no job's output" "is not a job's output of exercise" "$work/cwd" \
  --job-output "$work/other/notes.txt"
refused "no folder or id" "takes one folder or job id" "$work/cwd" --job-output
refused "two folders" "takes one folder or job id" "$work/cwd" --job-output "$work/empty" "$work/other"

if [ -n "$(find "$work/empty" "$work/cwd" -mindepth 1)" ] ||
   [ "$(find "$work/other" -mindepth 1 -printf '%P\n' | sort | tr '\n' ' ')" != "ex02-7.out notes.txt runs " ]; then
  echo "FAIL the refusals wrote into the folders they were given"
  failed=1
else
  echo "ok   nothing written into the folders given"
fi
[ "$failed" -eq 0 ] && echo "all checks passed"
exit "$failed"
