#!/usr/bin/env bash
# `make compat`: does the course still work with the newest releases of its big dependencies?
#
#   bash scripts/compat.sh [PYTHON] [JOBS] [PIP_ARGS...]
#
# Builds a scratch virtual environment in _build/compat/venv with the newest torch, numpy,
# matplotlib and jupyter-book<2 that the package index serves (everything else pinned as in
# requirements.txt), runs the unit tests and nbval over the book there, and writes
# _build/compat/report.md: the versions, each step's exit status and the tail of what failed.
# Exits non-zero when something broke. Not part of `make test` (it downloads and installs).
set -u -o pipefail

PYTHON=${1:-python3}
JOBS=${2:-2}
shift $(($# < 2 ? $# : 2))
PIP_ARGS=("$@")
OUT=_build/compat
VENV=$OUT/venv
REPORT=$OUT/report.md
NEWEST=(torch numpy matplotlib "jupyter-book<2")

rm -rf "$VENV" && mkdir -p "$OUT"
status=0
step() {  # step NAME LOGFILE COMMAND...: run, record the exit status and the log's tail
  local name=$1 log=$2
  shift 2
  echo "== $name" >&2
  "$@" >"$log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "- $name: ok" >>"$REPORT"
  else
    status=1
    { echo "- $name: **exit $rc** (log: $log)"; echo; echo '```'; tail -n 40 "$log"; echo '```'; } >>"$REPORT"
  fi
  return "$rc"
}

{ echo "# make compat: $(date -u +%Y-%m-%dT%H:%MZ)"; echo; } >"$REPORT"
# requirements.txt without the four packages whose newest releases are tried
grep -viE '^(torch|numpy|matplotlib|jupyter-book)[=<>~ ]' requirements.txt >"$OUT/requirements-rest.txt"
step "venv" "$OUT/venv.log" "$PYTHON" -m venv "$VENV" || exit 1
step "install (newest ${NEWEST[*]})" "$OUT/install.log" \
  "$VENV/bin/python" -m pip install "${PIP_ARGS[@]}" --upgrade "${NEWEST[@]}" -r "$OUT/requirements-rest.txt" \
  || { cat "$REPORT"; exit 1; }
{ echo; echo "Versions:"; echo; echo '```'
  "$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|numpy|matplotlib|jupyter-book|transformers) '
  echo '```'; echo; } >>"$REPORT"
"$VENV/bin/python" -c "import matplotlib.font_manager" >/dev/null 2>&1  # build the font cache once
step "unit tests" "$OUT/unit.log" "$VENV/bin/pytest" -q -n "$JOBS" -p no:cacheprovider tests
step "nbval (book/)" "$OUT/nbval.log" env OMP_NUM_THREADS=1 "$VENV/bin/pytest" -q --nbval-lax \
  --nbval-current-env -p no:cacheprovider -n "$JOBS" --dist loadfile book/
cat "$REPORT"
exit "$status"
