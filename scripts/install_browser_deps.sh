#!/usr/bin/env bash
# System packages of the browser tests (`make browser`, the last step of `make test`) and of
# `make pdf`: Debian's headless Chromium (package chromium; Playwright drives it, no browser
# download), fonts (fonts-noto-cjk for the Chinese text of the screenshots and the figures;
# fonts-wqy-microhei for the PDF: Chromium embeds this TrueType font as a real font, while it
# can only draw the CFF-based Noto CJK glyphs as nameless Type 3 outlines; fonts-liberation for
# Latin text) and poppler-utils (pdffonts/pdfinfo/pdftotext, which
# check the PDF). Installs with apt-get what is missing (as root, or with sudo).
#
# Afterwards matplotlib's font cache is rebuilt when it predates the CJK font: the venv builds
# that cache when it is created, usually before this script has installed any Chinese font, and
# matplotlib never rescans by itself, so tc.viz.cjk_font() would not see the font. Rebuilding it
# here (not inside a notebook cell) also keeps the "building the font cache" message off the
# book build's stderr. Used by the Makefile (make test, make browser, make pdf), hence by CI.
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

# matplotlib's font cache (of the project's venv, or of the python on PATH): rebuild it when no
# font in it has Chinese glyphs although the system has such a font.
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=$(command -v python3 || true); fi
fi
[ -n "$python" ] || exit 0
"$python" - <<'PY'
import os

try:
    import matplotlib
    from matplotlib import font_manager

    from transformer_course.viz import find_cjk_font  # the test that tc.viz.cjk_font() applies
except ImportError:  # no matplotlib or no course package in this python: nothing to refresh
    raise SystemExit(0)

if find_cjk_font(font_manager.fontManager.ttflist) is None:
    fresh = font_manager.FontManager()  # scans the system's fonts now
    if find_cjk_font(fresh.ttflist) is not None:
        # written next to the old cache and moved over it in one step: a notebook kernel that
        # reads the cache at this moment sees the old or the new file, never half of one
        name = f"fontlist-v{font_manager.FontManager.__version__}.json"
        cache = os.path.join(matplotlib.get_cachedir(), name)
        font_manager.json_dump(fresh, cache + ".tmp")
        os.replace(cache + ".tmp", cache)
        print(f"matplotlib font cache rebuilt, Chinese font: {find_cjk_font(fresh.ttflist)}")
PY
