#!/usr/bin/env bash
# download_cifar10.sh: stage CIFAR-10 (binary version) for the kit's exercise 02.
#
# Run it on the cluster's LOGIN node. Compute nodes usually have no internet, so a job started
# with sbatch cannot fetch its data: it reads the files this script leaves in DIR. Choose a DIR
# on a file system that the compute nodes also see (your home, or a shared scratch space).
#
# Usage: download_cifar10.sh [DIR]
#   DIR defaults to $CIFAR10_DIR, or else to $HOME/data/cifar-10.
#
# What it does:
#   1. When DIR already holds data_batch_1..5.bin and test_batch.bin of the expected sizes, it
#      says so and downloads nothing. Running it twice is safe.
#   2. Otherwise it downloads cifar-10-binary.tar.gz ($CIFAR10_URL first when set, then the
#      authors' site at the University of Toronto), checks its MD5 checksum, unpacks it in a
#      temporary folder inside DIR and checks every file's size (30,730,000 bytes: 10,000
#      records of 3,073 bytes). The files reach DIR only when all of that passed.
#
# Environment:
#   CIFAR10_DIR      the default DIR
#   CIFAR10_URL      an archive URL to try first (for instance your site's own mirror)
#   CIFAR10_FETCH    curl or wget (default: curl when installed, else wget)
#   CIFAR10_MD5      another expected checksum of the archive, and
#   CIFAR10_BYTES    "TRAIN_FILE TEST_FILE": other expected file sizes. The kit's tests use both
#                    to run this script on a small generated image set.
#
# Exit status: 0 when DIR holds verified files; 1 when it does not (each problem is one line on
# stderr); 2 for a usage error.
set -u

prog=download_cifar10.sh
info() { printf '%s: %s\n' "$prog" "$*"; }
warn() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { warn "$*"; exit 1; }
usage() { sed -n '2,/^set -u$/{/^#/s/^# \{0,1\}//p;}' "$0"; }

case $# in
  0) dir=${CIFAR10_DIR:-${HOME:-.}/data/cifar-10} ;;
  1) case $1 in
       -h | --help) usage; exit 0 ;;
       -*) warn "unknown option $1 (usage: $prog [DIR])"; exit 2 ;;
       *) dir=$1 ;;
     esac ;;
  *) warn "too many arguments (usage: $prog [DIR])"; exit 2 ;;
esac

md5_want=${CIFAR10_MD5:-c32a1d4ab5d03f1284b67883e8d87530}
read -r train_bytes test_bytes extra <<EOF
${CIFAR10_BYTES:-30730000 30730000}
EOF
for n in "${train_bytes:-}" "${test_bytes:-}"; do
  case $n in '' | *[!0-9]*) die "CIFAR10_BYTES must be two numbers (TRAIN_FILE TEST_FILE)" ;; esac
done
[ -z "${extra:-}" ] || die "CIFAR10_BYTES must be exactly two numbers"
files="data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin test_batch.bin"

# verified DIR: do all six files have their expected sizes? Sets $why to the first problem.
why=
verified() {
  local f want got
  for f in $files; do
    want=$train_bytes
    [ "$f" = test_batch.bin ] && want=$test_bytes
    if [ ! -f "$1/$f" ]; then why="$f is missing"; return 1; fi
    got=$(wc -c < "$1/$f")
    if [ $((got)) -ne "$want" ]; then
      why="$f is $((got)) bytes, expected $want ($((want / 3073)) records of 3073 bytes): a truncated or different file"
      return 1
    fi
  done
}

if verified "$dir"; then
  info "$dir already holds a verified CIFAR-10; nothing to download."
  exit 0
fi
[ -e "$dir/data_batch_1.bin" ] && info "replacing the files in $dir: $why"
info "compute nodes have no internet, so CIFAR-10 is staged now (on the login node) into $dir."

fetcher=${CIFAR10_FETCH:-}
if [ -z "$fetcher" ]; then
  if command -v curl > /dev/null 2>&1; then fetcher=curl
  elif command -v wget > /dev/null 2>&1; then fetcher=wget
  else die "neither curl nor wget is installed: cannot download anything"
  fi
fi
case $fetcher in
  curl | wget) command -v "$fetcher" > /dev/null 2>&1 || die "CIFAR10_FETCH=$fetcher, but $fetcher is not installed" ;;
  *) die "CIFAR10_FETCH must be curl or wget, not '$fetcher'" ;;
esac
command -v md5sum > /dev/null 2>&1 || die "md5sum is not installed: cannot check the archive"

mkdir -p "$dir" 2> /dev/null || die "cannot create $dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX" 2> /dev/null) || die "cannot write into $dir"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# try URL: download, checksum and unpack; sets $unpacked to the folder holding the six files, or
# $why to what went wrong.
unpacked=
try() {
  local url=$1 err sum inner
  info "trying $url ..."
  rm -rf "$tmp/archive" "$tmp/unpacked"
  case $fetcher in
    curl) err=$(curl --fail --silent --show-error --location --retry 2 --connect-timeout 20 \
                     --max-time 1800 --output "$tmp/archive" "$url" 2>&1) ;;
    wget) err=$(wget --quiet --tries=3 --timeout=20 --output-document="$tmp/archive" "$url" 2>&1) ;;
  esac || {
    err=$(printf '%s\n' "$err" | sed '/^[[:space:]]*$/d' | tail -n 1)
    why="cannot download $url${err:+ ($err)}"
    return 1
  }
  sum=$(md5sum < "$tmp/archive" | cut -d ' ' -f 1)
  if [ "$sum" != "$md5_want" ]; then
    why="$url gave a file with MD5 $sum, expected $md5_want: an error page or a damaged download"
    return 1
  fi
  mkdir -p "$tmp/unpacked"
  if ! tar -xzf "$tmp/archive" -C "$tmp/unpacked" 2> /dev/null; then
    why="$url is not a readable .tar.gz archive"; return 1
  fi
  # The real archive holds one folder, cifar-10-batches-bin/.
  inner=$(find "$tmp/unpacked" -name data_batch_1.bin | head -n 1)
  if [ -z "$inner" ]; then why="the archive from $url has no data_batch_1.bin"; return 1; fi
  inner=$(dirname "$inner")
  if ! verified "$inner"; then why="the archive from $url: $why"; return 1; fi
  unpacked=$inner
}

toronto=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
sources=0
try_source() {
  sources=$((sources + 1))
  if try "$1"; then return 0; fi
  warn "$why"
  return 1
}
if { [ -n "${CIFAR10_URL:-}" ] && try_source "$CIFAR10_URL"; } || try_source "$toronto"; then
  :
else
  die "could not get a good CIFAR-10 from any of the $sources sources above; set CIFAR10_URL to another copy of cifar-10-binary.tar.gz, or unpack one into $dir by hand"
fi

for f in $files batches.meta.txt; do
  [ -f "$unpacked/$f" ] || continue
  mv -f "$unpacked/$f" "$dir/$f" || die "cannot move $f into $dir"
done
verified "$dir" || die "$why"
info "done: $dir holds a verified CIFAR-10."
info "point your sbatch job at $dir (--data-dir); it must be on a file system the compute nodes can read."
