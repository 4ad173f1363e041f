#!/usr/bin/env bash
# Tests common/data/download_cifar10.sh without internet.
#
# A fake `curl` and a fake `wget` come first on PATH. They "download" a cifar-10-binary.tar.gz
# made from a small set that make_images generated, or fail the ways real networks fail
# (unreachable host, an HTML page instead of the archive, a truncated archive). CIFAR10_MD5 and
# CIFAR10_BYTES are those of the small set, so the script's checksum, unpacking, size checks,
# idempotence and error lines are all exercised.
#
# Usage: download_cifar10_test.sh SCRIPT MAKE_IMAGES
set -u
script=$1
make_images=$2

work=$(mktemp -d "${TMPDIR:-/tmp}/download_cifar10_test.XXXXXX") || exit 1
trap '[ -n "${KEEP_TEST_DIR:-}" ] || rm -rf "$work"' EXIT

passed=0
failed=0
expect() {  # expect DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok: $what"
  else failed=$((failed + 1)); echo "FAILED: $what"; fi
}

# --- The "remote" archive, laid out like the real one ----------------------------------------
remote=$work/remote
"$make_images" --out "$remote/cifar-10-batches-bin" --train 50 --test 20 --seed 3 > /dev/null ||
  { echo "FAILED: make_images did not run"; exit 1; }
tar -czf "$remote/archive.tar.gz" -C "$remote" cifar-10-batches-bin ||
  { echo "FAILED: cannot build the archive"; exit 1; }
head -c 2000 "$remote/archive.tar.gz" > "$remote/short.tar.gz"
CIFAR10_MD5=$(md5sum < "$remote/archive.tar.gz" | cut -d ' ' -f 1)
CIFAR10_BYTES="$((10 * 3073)) $((20 * 3073))"
export CIFAR10_MD5 CIFAR10_BYTES

# --- Fake download tools: FAKE_MODE says how the network behaves ------------------------------
#   good     the Toronto host serves the archive     html     every URL gives an HTML page
#   short    the archive is cut off                  offline  no host can be reached
# Every URL asked for is appended to $FAKE_LOG.
bin=$work/bin
mkdir -p "$bin"
cat > "$bin/curl" << 'FAKE'
#!/usr/bin/env bash
tool=$(basename "$0") out= url=
while [ $# -gt 0 ]; do
  case $1 in
    --output | -o) out=$2; shift ;;
    --output-document=*) out=${1#--output-document=} ;;
    -*) ;;
    *) url=$1 ;;
  esac
  shift
done
echo "$tool $url" >> "$FAKE_LOG"
case $FAKE_MODE:$url in
  html:*) echo '<!DOCTYPE html><html><body>Please log in</body></html>' > "$out" ;;
  good:https://www.cs.toronto.edu/*) cat "$FAKE_REMOTE/archive.tar.gz" > "$out" ;;
  short:https://www.cs.toronto.edu/*) cat "$FAKE_REMOTE/short.tar.gz" > "$out" ;;
  *) echo "$tool: could not resolve host for $url" >&2; exit 6 ;;
esac
FAKE
chmod +x "$bin/curl"
cp "$bin/curl" "$bin/wget"
export PATH="$bin:$PATH" FAKE_REMOTE="$remote" FAKE_LOG="$work/log"

# run NAME MODE DIR [ENV=VALUE...]: runs the script, keeping its stdout, stderr and exit status.
run() {
  local name=$1 mode=$2 dir=$3; shift 3
  : > "$work/log"
  env FAKE_MODE="$mode" "$@" bash "$script" "$dir" > "$work/$name.out" 2> "$work/$name.err"
  echo $? > "$work/$name.rc"
}
rc() { [ "$(cat "$work/$1.rc")" = "$2" ]; }
same_as_remote() {
  local f
  for f in data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin \
           test_batch.bin batches.meta.txt; do
    cmp -s "$remote/cifar-10-batches-bin/$f" "$1/$f" || return 1
  done
}
no_temp_in() { ! ls -d "$1"/.download.* > /dev/null 2>&1; }
no_data_in() { ! ls "$1"/*.bin "$1"/.download.* > /dev/null 2>&1; }
one_line_errors() { ! grep -v '^download_cifar10.sh: ' "$work/$1.err" > /dev/null; }
err_has() { grep -q -- "$2" "$work/$1.err"; }
fetches() { [ "$(wc -l < "$work/log")" -eq "$1" ]; }

# 1. The archive, checked and unpacked into DIR.
run good good "$work/d1"
expect "good: exit 0" rc good 0
expect "good: files unpacked and identical" same_as_remote "$work/d1"
expect "good: temporary folder removed" no_temp_in "$work/d1"

# 2. Idempotent: verified files are kept and nothing is fetched.
run again offline "$work/d1"
expect "again: exit 0, nothing fetched" eval 'rc again 0 && fetches 0'
expect "again: says nothing to download" grep -q 'nothing to download' "$work/again.out"

# 3. An HTML page instead of the archive: the checksum refuses it; nothing left behind.
run html html "$work/d3" CIFAR10_FETCH=wget
expect "html: exit 1" rc html 1
expect "html: checksum named" err_has html "expected $CIFAR10_MD5"
expect "html: nothing left in DIR" no_data_in "$work/d3"
expect "html: one line per failure" one_line_errors html

# 4. A truncated archive fails the checksum.
run short short "$work/d4"
expect "short: exit 1 and MD5 reported" eval 'rc short 1 && err_has short "gave a file with MD5"'

# 5. The real sizes reject the small set, naming the file and the expected size.
run real good "$work/d5" CIFAR10_BYTES="30730000 30730000"
expect "real sizes: exit 1" rc real 1
expect "real sizes: file and size named" err_has real 'data_batch_1.bin is 30730 bytes, expected 30730000'
expect "real sizes: nothing left in DIR" no_data_in "$work/d5"

# 6. No network: own mirror tried first, then a final line says what to do.
run offline offline "$work/d6" CIFAR10_URL=https://mirror.invalid/cifar.tar.gz
expect "offline: exit 1" rc offline 1
expect "offline: own mirror tried first" grep -q '^curl https://mirror.invalid/cifar.tar.gz$' "$work/log"
expect "offline: final advice" err_has offline 'could not get a good CIFAR-10 from any of the 2 sources'
expect "offline: one line per failure" one_line_errors offline

# 7. A truncated file already in DIR is replaced.
mkdir -p "$work/d7" && cp "$remote"/cifar-10-batches-bin/* "$work/d7/" &&
  head -c 3073 "$remote/cifar-10-batches-bin/data_batch_3.bin" > "$work/d7/data_batch_3.bin"
run repair good "$work/d7"
expect "repair: exit 0" rc repair 0
expect "repair: files good again" same_as_remote "$work/d7"
expect "repair: says why it replaces" grep -q 'data_batch_3.bin is 3073 bytes' "$work/repair.out"

# 8. Usage errors.
bash "$script" a b > /dev/null 2>&1; echo $? > "$work/usage.rc"
expect "usage: two arguments -> exit 2" rc usage 2
bash "$script" --help > "$work/help.out"
expect "usage: --help" grep -q '^Usage: download_cifar10.sh \[DIR\]' "$work/help.out"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
