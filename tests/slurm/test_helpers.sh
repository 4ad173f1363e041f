#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions below run through check(), which shellcheck cannot see
# test_helpers.sh: sbatch/job.sh's helpers and the site profiles, without a cluster.
#   * kit_first_of_nodelist agrees with kit::first_host on Slurm's node-list forms;
#   * kit_job_port is 20000 + SLURM_JOB_ID % 10000 (kit::port_for_job), KIT_MASTER_PORT wins,
#     and a bad KIT_MASTER_PORT stops the job with one line;
#   * kit_gpu_ids lists the job's GPUs;
#   * every site profile sources cleanly under `set -euo pipefail`, sets KIT_SITE to its own
#     name, and exports none of the SBATCH_* variables that would override the exercise's
#     #SBATCH lines (nodes, GPUs, tasks);
#   * kit_site_env loads the modules, or stops the job with one line when one is missing;
#   * the JSC profiles resolve the first node's InfiniBand name ("i" appended) to an address,
#     and fall back to the plain name with one warning line when it does not resolve.
#   * the account and partition saved with sbatch/account.sh (~/.config/ddp-kit/site.env, or
#     under $XDG_CONFIG_HOME) reach sbatch: every real site's profile exports them as
#     SBATCH_ACCOUNT/SBATCH_PARTITION; SBATCH_* in the environment (and JSC's $BUDGET_ACCOUNTS)
#     win over the file; the file wins over a profile's default partition; a malformed file is
#     one line on stderr and none of it is used; "local" ignores it; account.sh refuses a name
#     that is not one word, in one line, and leaves the file as it was.
#   * a reservation saved with account.sh --reservation reaches sbatch and salloc
#     (SBATCH_RESERVATION, SALLOC_RESERVATION); one that `scontrol show reservation` does not
#     know, or that has ended, is refused in one line when saved (the file as it was) and left
#     out with one line when a profile is sourced; without a controller to ask it is used as
#     saved (a stand-in scontrol here; slurm.handout asks a real one).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

# in_job CODE: run bash CODE with job.sh sourced, as the job scripts do.
in_job() {
  KIT_ROOT=$ROOT bash -c "set -euo pipefail; . '$ROOT/sbatch/job.sh'; $1"
}

# same WANT CODE: CODE prints WANT.
same() {
  local want=$1 got
  got=$(in_job "$2" 2>&1)
  [ "$got" = "$want" ] && return 0
  say "  '$2' printed '$got', expected '$want'"
  return 1
}

for pair in "jwb[0012-0015,0020],login1=jwb0012" "rack[0-3]_blade[07-41]=rack0_blade07" \
            "n[1-2]-ib,m1=n1-ib" "kitn1=kitn1" "kitn[1-2]=kitn1" "a,b=a" "nid[001234,001236]=nid001234"; do
  check "first node of ${pair%=*}" same "${pair##*=}" "kit_first_of_nodelist '${pair%=*}'"
done
check "port of job 123456" same 23456 "SLURM_JOB_ID=123456 kit_job_port"
check "port of job 7" same 20007 "SLURM_JOB_ID=7 kit_job_port"
check "KIT_MASTER_PORT wins" same 31234 "SLURM_JOB_ID=7 KIT_MASTER_PORT=31234 kit_job_port"
check "bad KIT_MASTER_PORT: one line" same \
  "job: error: KIT_MASTER_PORT='29x' is not a port number" "SLURM_JOB_ID=7 KIT_MASTER_PORT=29x kit_job_port"
check "GPU ids from Slurm" same 0,1,2,3 "KIT_SLURM_GPU_IDS=0,1,2,3 KIT_GPUS_PER_NODE=4 kit_gpu_ids"
check "GPU ids counted" same 0,1 "KIT_SLURM_GPU_IDS= KIT_GPUS_PER_NODE=2 kit_gpu_ids"
check "GPU ids: Slurm's list of the wrong length" same 0,1,2 \
  "KIT_SLURM_GPU_IDS=5 KIT_GPUS_PER_NODE=3 kit_gpu_ids"

# profile_ok NAME: sources cleanly, KIT_SITE=NAME, no forbidden SBATCH_* exported.
profile_ok() {
  local out
  out=$(env -i PATH="$PATH" HOME="${HOME:-/root}" bash -c \
        "set -euo pipefail; . '$ROOT/sbatch/sites/$1.sh'; echo \"site=\$KIT_SITE\"; env" 2>&1) ||
    { say "  sourcing $1.sh failed: $out"; return 1; }
  grep -qx "site=$1" <<<"$out" || { say "  KIT_SITE is not $1"; return 1; }
  if grep -E '^SBATCH_(GRES|GPUS|GPUS_PER_NODE|GPUS_PER_TASK|NTASKS|NODES)' <<<"$out"; then
    say "  $1.sh exports a variable that overrides the job script's #SBATCH lines"
    return 1
  fi
  return 0
}
for f in "$ROOT"/sbatch/sites/*.sh; do
  name=${f##*/}
  check "site profile ${name%.sh}" profile_ok "${name%.sh}"
done

# The JSC profiles, with a stand-in getent.
jsc_addr() {
  env -i PATH="$PATH" bash -c "set -euo pipefail
    getent() { [ \"\$2\" = jrc0042i ] && echo '10.11.12.13     jrc0042i'; }
    . '$ROOT/sbatch/sites/$1.sh'; kit_site_master_addr $2"
}
for site in jureca juwels-booster; do
  check "$site: InfiniBand address" test "$(jsc_addr "$site" jrc0042 2>/dev/null)" = 10.11.12.13
  check "$site: fallback to the host name" test "$(jsc_addr "$site" jrc0043 2>/dev/null)" = jrc0043
  check "$site: one warning line on fallback" \
    test "$(jsc_addr "$site" jrc0043 2>&1 >/dev/null | wc -l)" -eq 1
done
# site_env SITE MODULE_STATUS: kit_run_site_env as in a job, with a stand-in `module`.
site_env() {
  KIT_ROOT=$ROOT env -i PATH="$PATH" KIT_ROOT="$ROOT" bash -c "set -euo pipefail
    module() { return $2; }
    . '$ROOT/sbatch/job.sh'; KIT_SITE=$1; . '$ROOT/sbatch/sites/$1.sh'
    kit_run_site_env; echo loaded"
}
for site in jureca perlmutter; do
  check "$site: modules load" test "$(site_env "$site" 0 2>&1)" = loaded
  check "$site: a missing module stops the job with one line" \
    test "$(site_env "$site" 1 2>&1 | grep -c "^site $site: 'module load .*' failed: ")" -eq 1
  check "$site: ... and nothing else" test "$(site_env "$site" 1 2>&1 | wc -l)" -eq 1
done
check "jureca: partition dc-gpu" test "$(env -i bash -c ". '$ROOT/sbatch/sites/jureca.sh'; echo \$SBATCH_PARTITION")" = dc-gpu
check "juwels-booster: partition booster" \
  test "$(env -i bash -c ". '$ROOT/sbatch/sites/juwels-booster.sh'; echo \$SBATCH_PARTITION")" = booster
check "jureca: account from BUDGET_ACCOUNTS" \
  test "$(env -i BUDGET_ACCOUNTS=proj1 bash -c ". '$ROOT/sbatch/sites/jureca.sh'; echo \$SBATCH_ACCOUNT")" = proj1
check "perlmutter: GPU nodes" \
  test "$(env -i bash -c ". '$ROOT/sbatch/sites/perlmutter.sh'; echo \$SBATCH_CONSTRAINT")" = gpu

# The saved account and partition. saved HOME SITE [NAME=VALUE...]: source the profile of SITE
# with that HOME (and those variables) as a login shell would, then print what a child process
# (sbatch) sees: "<SBATCH_ACCOUNT> <SBATCH_PARTITION>", "-" for unset.
saved() {
  local home=$1 site=$2
  shift 2
  env -i PATH="$PATH" HOME="$home" "$@" bash -c "set -euo pipefail
    . '$ROOT/sbatch/sites/$site.sh'
    sh -c 'echo \"\${SBATCH_ACCOUNT:--} \${SBATCH_PARTITION:--}\"'"
}
home=$(mktemp -d "${TMPDIR:-/tmp}/kit-home.XXXXXX")
trap 'rm -rf "$home"' EXIT
# save ARGS...: sbatch/account.sh ARGS with that HOME; its stdout is dropped.
save() { env -i PATH="$PATH" HOME="$home" "$ROOT/sbatch/account.sh" "$@" >/dev/null; }
check "account.sh saves account and partition" save proj9 gpu-part_2
for site in generic perlmutter alps jureca juwels-booster; do
  check "$site: the saved account and partition" test "$(saved "$home" "$site")" = "proj9 gpu-part_2"
  check "$site: SBATCH_* in the environment win over the file" \
    test "$(saved "$home" "$site" SBATCH_ACCOUNT=envacct SBATCH_PARTITION=envpart)" = "envacct envpart"
done
check "jureca: BUDGET_ACCOUNTS wins over the saved account" \
  test "$(saved "$home" jureca BUDGET_ACCOUNTS=budget1)" = "budget1 gpu-part_2"
check "local: the test cluster ignores the saved account" test "$(saved "$home" local)" = "- -"
account_only() { save proj7 && test "$(saved "$home" jureca)" = "proj7 dc-gpu"; }
check "account only: the profile's own partition stays" account_only
mkdir -p "$home/xdg/ddp-kit"
printf 'KIT_ACCOUNT=xdgacct\n' >"$home/xdg/ddp-kit/site.env"
check "XDG_CONFIG_HOME: its ddp-kit/site.env" \
  test "$(saved "$home" generic XDG_CONFIG_HOME="$home/xdg")" = "xdgacct -"
file=$home/.config/ddp-kit/site.env
before=$(cat "$file")
check "account.sh: a name with a space is one error line" \
  test "$(save 'my proj' 2>&1 | grep -c .)" -eq 1
refused_kept() { ! save 'x;y' 2>/dev/null && test "$(cat "$file")" = "$before"; }
check "account.sh: ... refused, the file as it was" refused_kept
printf '# mine\nKIT_ACCOUNT=proj9\nKIT_PARTITON=gpu\n' >"$file"
check "a malformed file: nothing of it is used" test "$(saved "$home" generic 2>/dev/null)" = "- -"
check "a malformed file: one line on stderr, naming the file's line" \
  test "$(saved "$home" generic 2>&1 >/dev/null | grep -c "site.env line 3 is not KIT_ACCOUNT=")" -eq 1
check "a malformed file: ... and nothing else" \
  test "$(saved "$home" generic 2>&1 >/dev/null | wc -l)" -eq 1

# Reservations, with a stand-in scontrol: "course1" exists until 2099, "old" ended in 2020,
# every other name is not found; "nocontroller" mode answers as a login node whose controller
# cannot be reached.
stub=$home/stub
mkdir -p "$stub"
cat >"$stub/scontrol" <<'STUB'
#!/bin/sh
[ "${KIT_STUB_SCONTROL:-}" = nocontroller ] &&
  { echo "slurm_load_reservations error: Unable to contact slurm controller (connect failure)"; exit 1; }
case $4 in
  course1) echo "ReservationName=course1 StartTime=2026-01-01T09:00:00 EndTime=2099-01-01T17:00:00 Duration=1-00:00:00 State=ACTIVE" ;;
  old) echo "ReservationName=old StartTime=2020-01-01T09:00:00 EndTime=2020-01-01T17:00:00 Duration=08:00:00 State=INACTIVE" ;;
  *) echo "Reservation $4 not found"; exit 1 ;;
esac
STUB
chmod +x "$stub/scontrol"
# reserved SITE [NAME=VALUE...]: "<SBATCH_RESERVATION> <SALLOC_RESERVATION> <SBATCH_ACCOUNT>"
# as sbatch and salloc would see them after sourcing the profile, "-" for unset.
reserved() {
  local site=$1
  shift
  env -i PATH="$stub:$PATH" HOME="$home" "$@" bash -c "set -euo pipefail
    . '$ROOT/sbatch/sites/$site.sh'
    sh -c 'echo \"\${SBATCH_RESERVATION:--} \${SALLOC_RESERVATION:--} \${SBATCH_ACCOUNT:--}\"'"
}
save_res() { env -i PATH="$stub:$PATH" HOME="$home" "$ROOT/sbatch/account.sh" "$@"; }
rm -f "$file"
check "account.sh saves a reservation that exists" eval 'save_res proj9 gpu --reservation course1 >/dev/null'
check "... in the file" grep -qx 'KIT_RESERVATION=course1' "$file"
for site in generic jureca perlmutter alps; do
  check "$site: sbatch and salloc get the reservation" test "$(reserved "$site")" = "course1 course1 proj9"
done
check "SBATCH_RESERVATION in the environment wins" \
  test "$(reserved generic SBATCH_RESERVATION=mine)" = "mine - proj9"
check "local: the test cluster ignores the saved reservation" test "$(reserved local)" = "- - -"
before=$(cat "$file")
for name in nope old; do
  out=$(save_res proj9 gpu --reservation "$name" 2>&1 >/dev/null)
  rc=$?
  check "account.sh --reservation $name: refused, exit 1" test "$rc" -eq 1
  check "... in one line" test "$(printf '%s\n' "$out" | grep -c .)" -eq 1
  check "... saying why" grep -qE "reservation '$name' (does not exist|has ended \(EndTime=2020-01-01T17:00:00\))" <<<"$out"
  check "... the file as it was" test "$(cat "$file")" = "$before"
done
printf 'KIT_ACCOUNT=proj9\nKIT_RESERVATION=gone\n' >"$file"
check "a saved reservation that is gone: left out, the account still used" \
  test "$(reserved generic 2>/dev/null)" = "- - proj9"
check "... one line on stderr naming it" \
  test "$(reserved generic 2>&1 >/dev/null | grep -c "reservation 'gone' does not exist")" -eq 1
check "... and nothing else" test "$(reserved generic 2>&1 >/dev/null | wc -l)" -eq 1
check "no controller to ask: the saved reservation is used as it is" \
  test "$(reserved generic KIT_STUB_SCONTROL=nocontroller 2>&1)" = "gone gone proj9"
finish
