#!/usr/bin/env bash
# slides/setup.sh — install what building and testing the decks needs, on Debian 12:
#   apt:  pandoc (2.17), chromium, nodejs, npm, poppler-utils (pdfinfo), fonts-dejavu-core
#   npm:  slides/node_modules from slides/package-lock.json (reveal.js 5.2.1, ws), offline after
# Idempotent and quiet when everything is there; uses apt-get only when a tool is missing
# (as root, or through sudo). Exit code 0 when the slides can be built, 1 otherwise.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

missing=()
command -v pandoc >/dev/null 2>&1 || missing+=(pandoc)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v pdfinfo >/dev/null 2>&1 || missing+=(poppler-utils)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)

if [ ${#missing[@]} -gt 0 ]; then
  echo "slides/setup.sh: installing ${missing[*]} with apt-get" >&2
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "slides/setup.sh: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq >/dev/null
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# reveal.js must be 5.x: pandoc 2.17's template does not work with 6.x. The lockfile pins it.
want=$(sed -n 's/.*"reveal.js": *"\([^"]*\)".*/\1/p' "$here/package.json" | head -n1)
have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$here/node_modules/reveal.js/package.json" 2>/dev/null | head -n1 || true)
if [ "$have" != "$want" ] || [ ! -f "$here/node_modules/ws/package.json" ]; then
  echo "slides/setup.sh: npm ci (reveal.js $want, ws) into slides/node_modules" >&2
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

case $(pandoc --version | head -n1) in
  "pandoc 2."*) ;;
  *) echo "slides/setup.sh: warning: the decks are made for pandoc 2.x, found $(pandoc --version | head -n1)" >&2 ;;
esac
