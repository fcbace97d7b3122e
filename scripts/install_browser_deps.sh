#!/usr/bin/env bash
# System packages of the browser tests (`make browser`, the last step of `make test`):
# Debian's headless Chromium (package chromium; Playwright drives it, no browser download)
# and fonts: fonts-noto-cjk for the Chinese text of the screenshots, fonts-liberation for
# Latin text. Installs with apt-get what is missing (as root, or with sudo); does nothing
# when everything is there. Used by the Makefile, hence by .ci/run.
set -euo pipefail

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in chromium fonts-noto-cjk fonts-liberation; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$pkg")
    fi
  done
elif ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  missing+=(chromium)
fi
((${#missing[@]})) || exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser tests need: ${missing[*]} (no apt-get here: install them, or set CHROMIUM=/path/to/chromium)" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
