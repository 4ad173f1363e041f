#!/usr/bin/env bash
# sbatch/account.sh: your Slurm account and partition, saved once for every later login instead
# of exported again in each one.
#
#   sbatch/account.sh ACCOUNT [PARTITION]   saves them (replaces what was saved)
#   sbatch/account.sh                       shows the file and what it holds
#
# The file: ${XDG_CONFIG_HOME:-$HOME/.config}/ddp-kit/site.env, one NAME=value a line:
#     KIT_ACCOUNT=m1234
#     KIT_PARTITION=booster        (optional)
# Blank lines and lines starting with # may be there too. The values are plain words (letters,
# digits, _ . , -): the file is parsed, never sourced, so nothing in it runs.
#
# Who reads it: the site profiles (sbatch/sites/*.sh, all but "local") source this file and call
# kit_saved_site, which exports the saved values as SBATCH_ACCOUNT and SBATCH_PARTITION, the
# variables sbatch reads (#SBATCH lines cannot read variables). So after
#     source sbatch/sites/<site>.sh
# a plain `sbatch sbatch/.../run.sbatch` charges the saved account. Precedence: sbatch -A/-p on
# the command line > SBATCH_ACCOUNT/SBATCH_PARTITION already in the environment > the file > the
# profile's own defaults (e.g. JSC's $BUDGET_ACCOUNTS, partition dc-gpu). A malformed file is one
# line on stderr, and none of it is used.

# The file's path; fails when neither XDG_CONFIG_HOME nor HOME says where it is.
kit_site_file() {
  local dir=${XDG_CONFIG_HOME:-}
  if [ -z "$dir" ]; then
    [ -n "${HOME:-}" ] || return 1
    dir=$HOME/.config
  fi
  printf '%s\n' "$dir/ddp-kit/site.env"
}

# kit_saved_site: exports SBATCH_ACCOUNT and SBATCH_PARTITION from the file where they are not
# set yet. No file: nothing to do. Malformed: one line on stderr, returns 1, exports nothing.
# Safe under `set -euo pipefail` and without it (the profiles are sourced into login shells).
kit_saved_site() {
  local file line n=0 key value account='' partition=''
  file=$(kit_site_file) || return 0
  [ -f "$file" ] || return 0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    case $line in '' | '#'*) continue ;; esac
    key=${line%%=*} value=${line#*=}
    case $key in
      KIT_ACCOUNT) account=$value ;;
      KIT_PARTITION) partition=$value ;;
      *) key='' ;;
    esac
    if [ "$key" = '' ] || [ "$key" = "$line" ] || [ -z "$value" ] ||
      [[ $value == *[!A-Za-z0-9_.,-]* ]]; then
      echo "site profile: $file line $n is not KIT_ACCOUNT=<account> or" \
        "KIT_PARTITION=<partition> (got '$line'): nothing of the file is used; save again with" \
        "'sbatch/account.sh ACCOUNT [PARTITION]'" >&2
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
  return 0
}

kit_account_main() {
  local me=${0##*/} file word tmp
  case ${1:-} in
    -h | --help)
      sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
      return 0
      ;;
  esac
  file=$(kit_site_file) || {
    echo "$me: error: neither XDG_CONFIG_HOME nor HOME is set: no place for the file" >&2
    return 1
  }
  if [ $# -eq 0 ]; then
    if [ -f "$file" ]; then
      printf '%s:\n' "$file"
      cat "$file"
      kit_saved_site || return 1
    else
      echo "nothing saved ($file does not exist): $0 ACCOUNT [PARTITION]"
    fi
    return 0
  fi
  [ $# -le 2 ] || { echo "$me: error: usage: $0 ACCOUNT [PARTITION]" >&2; return 1; }
  for word in "$@"; do
    if [ -z "$word" ] || [[ $word == *[!A-Za-z0-9_.,-]* ]]; then
      echo "$me: error: '$word' is not an account or partition name (letters, digits, _ . , -)" >&2
      return 1
    fi
  done
  mkdir -p "${file%/*}" || { echo "$me: error: cannot create ${file%/*}" >&2; return 1; }
  # Written next to the file and renamed over it: a profile never reads half a file.
  tmp=$file.tmp.$$
  if ! {
    echo "# Written by the kit's sbatch/account.sh; read by its site profiles (sbatch/sites/)."
    echo "KIT_ACCOUNT=$1"
    [ $# -lt 2 ] || echo "KIT_PARTITION=$2"
  } >"$tmp" || ! mv -f "$tmp" "$file"; then
    rm -f "$tmp"
    echo "$me: error: cannot write $file" >&2
    return 1
  fi
  echo "saved to $file: account $1${2:+, partition $2}; every site profile you source from now on uses it"
  if [ -n "${SBATCH_ACCOUNT:-}" ] && [ "$SBATCH_ACCOUNT" != "$1" ]; then
    echo "note: SBATCH_ACCOUNT=$SBATCH_ACCOUNT in this shell wins over the file until you unset it"
  fi
  if [ $# -eq 2 ] && [ -n "${SBATCH_PARTITION:-}" ] && [ "$SBATCH_PARTITION" != "$2" ]; then
    echo "note: SBATCH_PARTITION=$SBATCH_PARTITION in this shell wins over the file until you unset it"
  fi
  return 0
}

# Run as a program: save or show. Sourced (by a site profile): only the functions above.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  kit_account_main "$@"
  exit $?
fi
