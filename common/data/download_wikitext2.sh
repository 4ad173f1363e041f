#!/usr/bin/env bash
# download_wikitext2.sh: stage the word-level WikiText-2 data set for the kit's exercise 01.
#
# Run it on the cluster's LOGIN node. Compute nodes usually have no internet, so a job started
# with sbatch cannot fetch its data: it reads the files this script leaves in DIR. Choose a DIR
# on a file system that the compute nodes also see (your home, or a shared scratch space).
#
# Usage: download_wikitext2.sh [DIR]
#   DIR defaults to $WIKITEXT2_DIR, or else to $HOME/data/wikitext-2.
#
# What it does:
#   1. When DIR already holds wiki.{train,valid,test}.tokens that pass the checks of step 3, it
#      says so and downloads nothing. Running it twice is safe.
#   2. Otherwise it tries these sources in turn until one gives three good files:
#        $WIKITEXT2_URL/wiki.{train,valid,test}.tokens   (only when you set WIKITEXT2_URL)
#        the pytorch/examples repository on GitHub, word_language_model/data/wikitext-2/
#        {train,valid,test}.txt (the same text under other names)
#        the original archive wikitext-2-v1.zip (two known hosts; needs unzip or python3)
#      and names the files wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens.
#   3. It checks every file: not empty, no NUL bytes, not an HTML error page, and a token count
#      (words plus one <eos> per line, empty lines included: how the kit's loader and PyTorch's
#      word_language_model example count) within 2% of train 2,088,628, valid 217,646,
#      test 245,569. The files reach DIR only when all three pass; until then they sit in a
#      temporary folder inside DIR, removed on exit.
#
# Environment:
#   WIKITEXT2_DIR                 the default DIR
#   WIKITEXT2_URL                 a base URL to try first (for instance your site's own mirror)
#   WIKITEXT2_FETCH               curl or wget (default: curl when installed, else wget)
#   WIKITEXT2_EXPECTED_TOKENS     "TRAIN VALID TEST": other expected token counts. The kit's tests
#                                 use it to run this script on a small generated corpus.
#   WIKITEXT2_TOLERANCE_PERCENT   allowed difference from the expected counts (default 2)
#
# Exit status: 0 when DIR holds verified files; 1 when it does not (each problem is one line on
# stderr); 2 for a usage error.
set -u

prog=download_wikitext2.sh
info() { printf '%s: %s\n' "$prog" "$*"; }
warn() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { warn "$*"; exit 1; }
usage() { sed -n '2,/^set -u$/{/^#/s/^# \{0,1\}//p;}' "$0"; }

case $# in
  0) dir=${WIKITEXT2_DIR:-${HOME:-.}/data/wikitext-2} ;;
  1) case $1 in
       -h | --help) usage; exit 0 ;;
       -*) warn "unknown option $1 (usage: $prog [DIR])"; exit 2 ;;
       *) dir=$1 ;;
     esac ;;
  *) warn "too many arguments (usage: $prog [DIR])"; exit 2 ;;
esac

splits="train valid test"
read -r want_train want_valid want_test extra <<EOF
${WIKITEXT2_EXPECTED_TOKENS:-2088628 217646 245569}
EOF
tolerance=${WIKITEXT2_TOLERANCE_PERCENT:-2}
for n in "${want_train:-}" "${want_valid:-}" "${want_test:-}" "$tolerance"; do
  case $n in
    '' | *[!0-9]*) die "WIKITEXT2_EXPECTED_TOKENS must be three numbers and WIKITEXT2_TOLERANCE_PERCENT one number" ;;
  esac
done
[ -z "${extra:-}" ] || die "WIKITEXT2_EXPECTED_TOKENS must be exactly three numbers"

expected_tokens() {
  case $1 in
    train) echo "$want_train" ;;
    valid) echo "$want_valid" ;;
    test) echo "$want_test" ;;
  esac
}

# check FILE SPLIT [NAME]: returns 0 when FILE looks like that split of WikiText-2 (and records
# its token count in $got_SPLIT), else sets $why to a message about NAME (default: FILE).
why=
got_train='' got_valid='' got_test=''
check() {
  local file=$1 split=$2 name=${3:-$1} want bytes text_bytes tokens slack
  want=$(expected_tokens "$split")
  if [ ! -f "$file" ]; then why="$name is missing"; return 1; fi
  if [ ! -s "$file" ]; then why="$name is empty"; return 1; fi
  bytes=$(wc -c < "$file")
  text_bytes=$(tr -d '\000' < "$file" | wc -c)
  if [ $((bytes)) -ne $((text_bytes)) ]; then
    why="$name contains NUL bytes: not a text file, or a damaged download"; return 1
  fi
  if head -c 1024 "$file" | grep -qi -e '<!doctype' -e '<html'; then
    why="$name is an HTML page (an error page or a login portal), not WikiText"; return 1
  fi
  tokens=$(LC_ALL=C awk '{ n += NF + 1 } END { print n + 0 }' "$file")
  slack=$((want * tolerance / 100))
  if [ "$tokens" -lt $((want - slack)) ] || [ "$tokens" -gt $((want + slack)) ]; then
    why="$name has $tokens tokens, expected $want (within $tolerance%): a truncated or different file"
    return 1
  fi
  case $split in
    train) got_train=$tokens ;;
    valid) got_valid=$tokens ;;
    test) got_test=$tokens ;;
  esac
  return 0
}

# verified DIR: are all three wiki.SPLIT.tokens in DIR good? Reports the first problem in $why.
verified() {
  local split
  for split in $splits; do
    check "$1/wiki.$split.tokens" "$split" || return 1
  done
}

# --- Already there? ---------------------------------------------------------------------------
if verified "$dir"; then
  info "$dir already holds a verified WikiText-2 (tokens: train $got_train, valid $got_valid, test $got_test); nothing to download."
  exit 0
fi
if [ -e "$dir/wiki.train.tokens" ] || [ -e "$dir/wiki.valid.tokens" ] || [ -e "$dir/wiki.test.tokens" ]; then
  info "replacing the files in $dir: $why"
fi

info "compute nodes have no internet, so WikiText-2 is staged now (on the login node) into $dir."

fetcher=${WIKITEXT2_FETCH:-}
if [ -z "$fetcher" ]; then
  if command -v curl > /dev/null 2>&1; then fetcher=curl
  elif command -v wget > /dev/null 2>&1; then fetcher=wget
  else die "neither curl nor wget is installed: cannot download anything"
  fi
fi
case $fetcher in
  curl | wget) command -v "$fetcher" > /dev/null 2>&1 || die "WIKITEXT2_FETCH=$fetcher, but $fetcher is not installed" ;;
  *) die "WIKITEXT2_FETCH must be curl or wget, not '$fetcher'" ;;
esac

mkdir -p "$dir" 2> /dev/null || die "cannot create $dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX" 2> /dev/null) || die "cannot write into $dir"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# fetch URL FILE: one download; on failure sets $why to the tool's last error line.
fetch() {
  local err
  case $fetcher in
    curl) err=$(curl --fail --silent --show-error --location --retry 2 --connect-timeout 20 \
                     --max-time 900 --output "$2" "$1" 2>&1) ;;
    wget) err=$(wget --quiet --tries=3 --timeout=20 --output-document="$2" "$1" 2>&1) ;;
  esac || {
    err=$(printf '%s\n' "$err" | sed '/^[[:space:]]*$/d' | tail -n 1)
    why="cannot download $1${err:+ ($err)}"
    rm -f "$2"
    return 1
  }
}

# extract ZIP SPLIT FILE: copies the archive's wiki.SPLIT.tokens to FILE.
extract() {
  local member
  if command -v unzip > /dev/null 2>&1; then
    member=$(unzip -Z1 "$1" 2> /dev/null | grep "wiki\.$2\.tokens\$" | head -n 1)
    [ -n "$member" ] && unzip -p "$1" "$member" > "$3" 2> /dev/null && return 0
  elif command -v python3 > /dev/null 2>&1; then
    python3 - "$1" "$2" > "$3" 2> /dev/null << 'PY' && return 0
import sys, zipfile
archive = zipfile.ZipFile(sys.argv[1])
name = next(n for n in archive.namelist() if n.endswith("wiki.%s.tokens" % sys.argv[2]))
sys.stdout.buffer.write(archive.read(name))
PY
  else
    why="$1 needs unzip or python3 to be unpacked, and neither is installed"; return 1
  fi
  why="the archive from $zip_url has no readable wiki.$2.tokens"
  return 1
}

# Three separate files: BASE/<prefix>SPLIT<suffix>.
try_files() {
  local base=$1 prefix=$2 suffix=$3 split
  for split in $splits; do
    fetch "$base/$prefix$split$suffix" "$tmp/$split" || return 1
    check "$tmp/$split" "$split" "$base/$prefix$split$suffix" || return 1
  done
}

# The original archive.
zip_url=
try_zip() {
  local split
  zip_url=$1
  fetch "$zip_url" "$tmp/wikitext-2.zip" || return 1
  if [ "$(head -c 2 "$tmp/wikitext-2.zip")" != PK ]; then  # every zip file starts with "PK"
    why="$zip_url did not give a zip archive (an error page?)"; return 1
  fi
  for split in $splits; do
    extract "$tmp/wikitext-2.zip" "$split" "$tmp/$split" || return 1
    check "$tmp/$split" "$split" "wiki.$split.tokens from $zip_url" || return 1
  done
}

github=https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2
sources=0
try_source() {
  sources=$((sources + 1))
  info "trying $2 ..."
  if "$@"; then return 0; fi
  warn "$why"
  return 1
}
if { [ -n "${WIKITEXT2_URL:-}" ] && try_source try_files "${WIKITEXT2_URL%/}" wiki. .tokens; } ||
   try_source try_files "$github" "" .txt ||
   try_source try_zip https://wikitext.smerity.com/wikitext-2-v1.zip ||
   try_source try_zip https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip; then
  :
else
  die "could not get a good WikiText-2 from any of the $sources sources above; set WIKITEXT2_URL to another mirror, or copy wiki.{train,valid,test}.tokens into $dir by hand"
fi

for split in $splits; do
  mv -f "$tmp/$split" "$dir/wiki.$split.tokens" || die "cannot move $split into $dir/wiki.$split.tokens"
done
verified "$dir" || die "$why"
info "done: $dir holds WikiText-2 (tokens: train $got_train, valid $got_valid, test $got_test)."
info "point your sbatch job at $dir; it must be on a file system the compute nodes can read."
