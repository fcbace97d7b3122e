#!/usr/bin/env bash
# System packages of the browser tests (`make browser`, the last step of `make test`) and of
# `make pdf`: Debian's headless Chromium (package chromium; Playwright drives it, no browser
# download), fonts (fonts-noto-cjk for the Chinese text that Chromium draws: the pages, JupyterLab;
# the figures need no system font, they use the package's own, src/transformer_course/fonts;
# fonts-wqy-microhei for the PDF: Chromium embeds this TrueType font as a real font, while it
# can only draw the CFF-based Noto CJK glyphs as nameless Type 3 outlines; fonts-liberation for
# Latin text) and poppler-utils (pdffonts/pdfinfo/pdftotext, which
# check the PDF). Installs with apt-get what is missing (as root, or with sudo).
# Used by the Makefile (make lab-test, make browser, make pdf), hence by CI.
set -euo pipefail

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in chromium fonts-noto-cjk fonts-wqy-microhei fonts-liberation poppler-utils; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$pkg")
    fi
  done
elif ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  missing+=(chromium)
fi

if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "browser tests need: ${missing[*]} (no apt-get here: install them, or set CHROMIUM=/path/to/chromium)" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "installing ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi
