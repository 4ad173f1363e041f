#!/usr/bin/env bash
# sbatch/account.sh: your Slurm account, partition and the course's reservation, saved once for
# every later login instead of exported again in each one.
#
#   sbatch/account.sh ACCOUNT [PARTITION] [--reservation NAME]
#                                           saves them (replaces what was saved)
#   sbatch/account.sh                       shows the file and what it holds
#
# The file: ${XDG_CONFIG_HOME:-$HOME/.config}/ddp-kit/site.env, one NAME=value a line:
#     KIT_ACCOUNT=m1234
#     KIT_PARTITION=booster        (optional)
#     KIT_RESERVATION=course-day1  (optional: the course's reservation, from your instructor)
# Blank lines and lines starting with # may be there too. The values are plain words (letters,
# digits, _ . , -): the file is parsed, never sourced, so nothing in it runs.
#
# Who reads it: the site profiles (sbatch/sites/*.sh, all but "local") source this file and call
# kit_saved_site, which exports the saved values as SBATCH_ACCOUNT, SBATCH_PARTITION and
# SBATCH_RESERVATION, the variables sbatch reads (#SBATCH lines cannot read variables), and the
# reservation as SALLOC_RESERVATION too, for salloc. So after
#     source sbatch/sites/<site>.sh
# a plain `sbatch sbatch/.../run.sbatch` charges the saved account and runs in the reservation.
# Precedence: sbatch -A/-p/--reservation on the command line > SBATCH_* already in the
# environment > the file > the profile's own defaults (e.g. JSC's $BUDGET_ACCOUNTS, partition
# dc-gpu). A malformed file is one line on stderr, and none of it is used.
#
# A reservation that does not exist, or has ended, is one line before anything is submitted:
# saving it is refused (exit 1, the file as it was), and a profile sourced after it ended says
# so and leaves it out. Both ask `scontrol show reservation NAME` (Slurm deletes a reservation
# when it ends); where scontrol is missing or cannot reach the controller, nothing is checked.

# The file's path; fails when neither XDG_CONFIG_HOME nor HOME says where it is.
kit_site_file() {
  local dir=${XDG_CONFIG_HOME:-}
  if [ -z "$dir" ]; then
    [ -n "${HOME:-}" ] || return 1
    dir=$HOME/.config
  fi
  printf '%s\n' "$dir/ddp-kit/site.env"
}

# kit_reservation_problem NAME: one line (on stdout) when the reservation NAME does not exist or
# has ended, as `scontrol show reservation` tells; nothing when it is there, or when there is no
# scontrol to ask or it cannot reach the controller (sbatch then has the last word).
kit_reservation_problem() {
  local name=$1 out end end_s
  command -v scontrol >/dev/null 2>&1 || return 0
  out=$(scontrol -o show reservation "$name" 2>&1) || :
  case $out in
    *"ReservationName=$name "*) ;;
    *[Nn]"ot found"* | *"No reservations"*)
      echo "reservation '$name' does not exist (scontrol show reservation: ${out%%$'\n'*})"
      return 0 ;;
    *) return 0 ;;  # no controller to ask: not ours to judge
  esac
  end=$(printf '%s\n' "$out" | tr ' ' '\n' | sed -n 's/^EndTime=//p' | head -n 1)
  end_s=$(date -d "$end" +%s 2>/dev/null) || return 0
  if [ "$end_s" -le "$(date +%s)" ]; then
    echo "reservation '$name' has ended (EndTime=$end)"
  fi
  return 0
}

# kit_saved_site: exports SBATCH_ACCOUNT, SBATCH_PARTITION and SBATCH_RESERVATION (and
# SALLOC_RESERVATION) from the file where they are not set yet. No file: nothing to do.
# Malformed: one line on stderr, returns 1, exports nothing. A saved reservation that does not
# exist or has ended: one line on stderr, returns 1, the rest is exported.
# Safe under `set -euo pipefail` and without it (the profiles are sourced into login shells).
kit_saved_site() {
  local file line n=0 key value account='' partition='' reservation='' why
  file=$(kit_site_file) || return 0
  [ -f "$file" ] || return 0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    case $line in '' | '#'*) continue ;; esac
    key=${line%%=*} value=${line#*=}
    case $key in
      KIT_ACCOUNT) account=$value ;;
      KIT_PARTITION) partition=$value ;;
      KIT_RESERVATION) reservation=$value ;;
      *) key='' ;;
    esac
    if [ "$key" = '' ] || [ "$key" = "$line" ] || [ -z "$value" ] ||
      [[ $value == *[!A-Za-z0-9_.,-]* ]]; then
      echo "site profile: $file line $n is not KIT_ACCOUNT=<account>," \
        "KIT_PARTITION=<partition> or KIT_RESERVATION=<reservation> (got '$line'): nothing of" \
        "the file is used; save again with 'sbatch/account.sh ACCOUNT [PARTITION]" \
        "[--reservation NAME]'" >&2
      return 1
    fi
  done <"$file"
  if [ -n "$account" ] && [ -z "${SBATCH_ACCOUNT:-}" ]; then
    SBATCH_ACCOUNT=$account
    export SBATCH_ACCOUNT
  fi
  if [ -n "$partition" ] && [ -z "${SBATCH_PARTITION:-}" ]; then
    SBATCH_PARTITION=$partition
    export SBATCH_PARTITION
  fi
  if [ -n "$reservation" ] && [ -z "${SBATCH_RESERVATION:-}" ]; then
    why=$(kit_reservation_problem "$reservation")
    if [ -n "$why" ]; then
      echo "site profile: $why, so jobs go without it; ask your instructor for the course's" \
        "reservation and save it with 'sbatch/account.sh ACCOUNT [PARTITION] --reservation" \
        "NAME' (saved in $file)" >&2
      return 1
    fi
    SBATCH_RESERVATION=$reservation
    SALLOC_RESERVATION=${SALLOC_RESERVATION:-$reservation}
    export SBATCH_RESERVATION SALLOC_RESERVATION
  fi
  return 0
}

kit_account_main() {
  local me=${0##*/} file word tmp reservation='' why
  local -a words=()
  case ${1:-} in
    -h | --help)
      sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
      return 0
      ;;
  esac
  while [ $# -gt 0 ]; do
    case $1 in
      --reservation)
        [ $# -ge 2 ] || { echo "$me: error: --reservation needs a name" >&2; return 1; }
        reservation=$2
        [ -n "$reservation" ] || { echo "$me: error: --reservation needs a name" >&2; return 1; }
        shift 2 ;;
      --reservation=*) reservation=${1#*=}; shift ;;
      *) words+=("$1"); shift ;;
    esac
  done
  set -- "${words[@]+"${words[@]}"}"
  file=$(kit_site_file) || {
    echo "$me: error: neither XDG_CONFIG_HOME nor HOME is set: no place for the file" >&2
    return 1
  }
  if [ $# -eq 0 ] && [ -z "$reservation" ]; then
    if [ -f "$file" ]; then
      printf '%s:\n' "$file"
      cat "$file"
      kit_saved_site || return 1
    else
      echo "nothing saved ($file does not exist): $0 ACCOUNT [PARTITION]"
    fi
    return 0
  fi
  if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "$me: error: usage: $0 ACCOUNT [PARTITION] [--reservation NAME]" >&2
    return 1
  fi
  for word in "$@" ${reservation:+"$reservation"}; do
    if [ -z "$word" ] || [[ $word == *[!A-Za-z0-9_.,-]* ]]; then
      echo "$me: error: '$word' is not an account, partition or reservation name (letters, digits, _ . , -)" >&2
      return 1
    fi
  done
  if [ -n "$reservation" ]; then
    why=$(kit_reservation_problem "$reservation")
    if [ -n "$why" ]; then
      echo "$me: error: $why: nothing saved; 'scontrol show reservation' lists the ones there are" >&2
      return 1
    fi
  fi
  mkdir -p "${file%/*}" || { echo "$me: error: cannot create ${file%/*}" >&2; return 1; }
  # Written next to the file and renamed over it: a profile never reads half a file.
  tmp=$file.tmp.$$
  if ! {
    echo "# Written by the kit's sbatch/account.sh; read by its site profiles (sbatch/sites/)."
    echo "KIT_ACCOUNT=$1"
    [ $# -lt 2 ] || echo "KIT_PARTITION=$2"
    [ -z "$reservation" ] || echo "KIT_RESERVATION=$reservation"
  } >"$tmp" || ! mv -f "$tmp" "$file"; then
    rm -f "$tmp"
    echo "$me: error: cannot write $file" >&2
    return 1
  fi
  echo "saved to $file: account $1${2:+, partition $2}${reservation:+, reservation $reservation};" \
    "every site profile you source from now on uses it"
  if [ -n "${SBATCH_ACCOUNT:-}" ] && [ "$SBATCH_ACCOUNT" != "$1" ]; then
    echo "note: SBATCH_ACCOUNT=$SBATCH_ACCOUNT in this shell wins over the file until you unset it"
  fi
  if [ $# -eq 2 ] && [ -n "${SBATCH_PARTITION:-}" ] && [ "$SBATCH_PARTITION" != "$2" ]; then
    echo "note: SBATCH_PARTITION=$SBATCH_PARTITION in this shell wins over the file until you unset it"
  fi
  if [ -n "$reservation" ] && [ -n "${SBATCH_RESERVATION:-}" ] && [ "$SBATCH_RESERVATION" != "$reservation" ]; then
    echo "note: SBATCH_RESERVATION=$SBATCH_RESERVATION in this shell wins over the file until you unset it"
  fi
  return 0
}

# Run as a program: save or show. Sourced (by a site profile): only the functions above.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  kit_account_main "$@"
  exit $?
fi
