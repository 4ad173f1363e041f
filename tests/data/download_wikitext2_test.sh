#!/usr/bin/env bash
# Tests common/data/download_wikitext2.sh without internet.
#
# A fake `curl` and a fake `wget` come first on PATH. They "download" from a small corpus that
# make_corpus generated, the way the real hosts would serve WikiText-2 (separate .txt files, or
# the zip archive), or they fail the ways real networks fail (unreachable host, HTML error page,
# truncated file). The expected token counts are those of the small corpus
# (WIKITEXT2_EXPECTED_TOKENS), so the script's renaming, checking, idempotence and error lines
# are all exercised.
#
# Usage: download_wikitext2_test.sh SCRIPT MAKE_CORPUS
set -u
script=$1
make_corpus=$2

work=$(mktemp -d "${TMPDIR:-/tmp}/download_wikitext2_test.XXXXXX") || exit 1
trap '[ -n "${KEEP_TEST_DIR:-}" ] || rm -rf "$work"' EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }
not_ok() { failed=$((failed + 1)); echo "FAILED: $*"; }
expect() {  # expect DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then ok "$what"; else not_ok "$what"; fi
}

# --- The "remote" data -------------------------------------------------------------------------
remote=$work/remote
"$make_corpus" --out "$remote" --train-tokens 3000 --valid-tokens 400 --test-tokens 400 --seed 7 ||
  { echo "FAILED: make_corpus did not run"; exit 1; }
count() { LC_ALL=C awk '{ n += NF + 1 } END { print n + 0 }' "$1"; }
WIKITEXT2_EXPECTED_TOKENS="$(count "$remote/wiki.train.tokens") $(count "$remote/wiki.valid.tokens") $(count "$remote/wiki.test.tokens")"
export WIKITEXT2_EXPECTED_TOKENS
(cd "$remote" && mkdir -p zip/wikitext-2 && cp wiki.*.tokens zip/wikitext-2/ &&
   cd zip && python3 -c 'import zipfile, sys
with zipfile.ZipFile("../wikitext-2-v1.zip", "w") as z:
    for s in ("train", "valid", "test"):
        z.write("wikitext-2/wiki.%s.tokens" % s)') || { echo "FAILED: cannot build the zip"; exit 1; }

# --- Fake download tools -----------------------------------------------------------------------
# FAKE_MODE says how the network behaves:
#   github   the GitHub files exist, everything else is unreachable
#   zip      GitHub answers 404, the archive host serves the zip
#   html     every URL gives an HTML page (a captive portal)
#   short    GitHub serves a truncated train.txt
#   offline  no host can be reached
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
    -O) out=$2; shift ;;
    -*) ;;
    *) url=$1 ;;
  esac
  shift
done
echo "$tool $url" >> "$FAKE_LOG"
unreachable() { echo "$tool: could not resolve host for $url" >&2; exit 6; }
not_found() { echo "$tool: (22) The requested URL returned error: 404" >&2; exit 22; }
serve() { cat "$1" > "$out"; exit 0; }
split=$(basename "$url"); split=${split%.txt}
case $FAKE_MODE:$url in
  html:*) echo '<!DOCTYPE html><html><body>Please log in</body></html>' > "$out"; exit 0 ;;
  offline:*) unreachable ;;
  github:https://raw.githubusercontent.com/*.txt) serve "$FAKE_REMOTE/wiki.$split.tokens" ;;
  short:https://raw.githubusercontent.com/*/train.txt) head -c 2000 "$FAKE_REMOTE/wiki.train.tokens" > "$out"; exit 0 ;;
  short:https://raw.githubusercontent.com/*.txt) serve "$FAKE_REMOTE/wiki.$split.tokens" ;;
  zip:https://raw.githubusercontent.com/*) not_found ;;
  zip:https://wikitext.smerity.com/wikitext-2-v1.zip) serve "$FAKE_REMOTE/wikitext-2-v1.zip" ;;
  *) unreachable ;;
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
  local split
  for split in train valid test; do
    cmp -s "$remote/wiki.$split.tokens" "$1/wiki.$split.tokens" || return 1
  done
}
no_temp_in() { ! ls -d "$1"/.download.* > /dev/null 2>&1; }
no_data_in() { ! ls "$1"/wiki.*.tokens > /dev/null 2>&1 && no_temp_in "$1"; }
# Every line on stderr is one message of the script.
one_line_errors() { ! grep -v '^download_wikitext2.sh: ' "$work/$1.err" > /dev/null; }
err_has() { grep -q -- "$2" "$work/$1.err"; }
fetches() { [ "$(wc -l < "$work/log")" -eq "$1" ]; }

# 1. GitHub's train.txt/valid.txt/test.txt, renamed to wiki.*.tokens.
run github github "$work/d1"
expect "github: exit 0" rc github 0
expect "github: files renamed and identical" same_as_remote "$work/d1"
expect "github: three downloads" fetches 3
expect "github: temporary folder removed" no_temp_in "$work/d1"

# 2. Idempotent: verified files are kept and nothing is fetched.
run again offline "$work/d1"
expect "again: exit 0" rc again 0
expect "again: says nothing to download" grep -q 'nothing to download' "$work/again.out"
expect "again: no download" fetches 0

# 3. The zip archive, with wget, after GitHub fails.
run zip zip "$work/d3" WIKITEXT2_FETCH=wget
expect "zip: exit 0" rc zip 0
expect "zip: files extracted and identical" same_as_remote "$work/d3"
expect "zip: GitHub failure reported in one line" err_has zip 'wikitext-2/train.txt (wget: (22)'

# 4. An HTML page instead of data: refused, nothing left behind.
run html html "$work/d4"
expect "html: exit 1" rc html 1
expect "html: says HTML" err_has html 'wikitext-2/train.txt is an HTML page'
expect "html: zip host gave no zip" err_has html 'wikitext-2-v1.zip did not give a zip archive'
expect "html: nothing left in DIR" no_data_in "$work/d4"
expect "html: one line per failure" one_line_errors html

# 5. A truncated file fails the token count.
run short short "$work/d5"
expect "short: exit 1" rc short 1
expect "short: token count reported" err_has short 'wikitext-2/train.txt has [0-9]* tokens, expected'
expect "short: nothing left in DIR" no_data_in "$work/d5"

# 6. The real WikiText-2 counts reject the small corpus.
run real_counts github "$work/d6" WIKITEXT2_EXPECTED_TOKENS="2088628 217646 245569"
expect "real counts: exit 1" rc real_counts 1
expect "real counts: expected 2088628" err_has real_counts 'expected 2088628 (within 2%)'

# 7. No network at all: a final line says what to do.
run offline offline "$work/d7"
expect "offline: exit 1" rc offline 1
expect "offline: final advice" err_has offline 'could not get a good WikiText-2 from any of the 3 sources'
expect "offline: one line per failure" one_line_errors offline
expect "offline: nothing left in DIR" no_data_in "$work/d7"

# 8. A damaged file already in DIR is replaced; WIKITEXT2_URL is tried first.
mkdir -p "$work/d8" && cp "$remote"/wiki.*.tokens "$work/d8/" && : > "$work/d8/wiki.valid.tokens"
run repair github "$work/d8" WIKITEXT2_URL=https://mirror.invalid/wt2/
expect "repair: exit 0" rc repair 0
expect "repair: says why it replaces" grep -q 'wiki.valid.tokens is empty' "$work/repair.out"
expect "repair: own mirror tried first" grep -q '^curl https://mirror.invalid/wt2/wiki.train.tokens$' "$work/log"
expect "repair: files good again" same_as_remote "$work/d8"

# 9. Usage errors.
bash "$script" a b > /dev/null 2> "$work/usage.err"; echo $? > "$work/usage.rc"
expect "usage: two arguments -> exit 2" rc usage 2
bash "$script" --help > "$work/help.out"
expect "usage: --help" grep -q '^Usage: download_wikitext2.sh \[DIR\]' "$work/help.out"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
