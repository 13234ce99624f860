#!/usr/bin/env bash
# doors: test
# MLflow for the test of `tracefleet train`'s MLflow logging (tracefleet.dashboard.trackers; the `tracking` extra).
# mlflow-skinny pins importlib_metadata<10 and .venv holds 10.x (pygal's), so it is not installed into .venv:
# what installing it there would add or change (pip's own report of it, importlib_metadata 9 included) goes into
# its own folder, $TRACEFLEET_CACHE/tracking/site, which the test puts first on a child process's PYTHONPATH.
# Idempotent: a finished folder carries a stamp naming the version.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
MLFLOW_VERSION=3.17.2
[ -x "$PY" ] || { echo "26-tracking.sh: .venv missing (10-python.sh creates it)" >&2; exit 1; }
CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
SITE="$CACHE/tracking/site"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$CACHE/pip}"
if [ "$(cat "$SITE/.installed" 2>/dev/null)" != "mlflow-skinny==$MLFLOW_VERSION" ]; then
  echo "    installing mlflow-skinny $MLFLOW_VERSION into $SITE"
  rm -rf "$SITE" && mkdir -p "$SITE"
  "$PY" -m pip install -q --dry-run --report "$SITE.report.json" "mlflow-skinny==$MLFLOW_VERSION"
  mapfile -t pins < <("$PY" -c 'import json, sys
for p in json.load(open(sys.argv[1]))["install"]:
    print(p["metadata"]["name"] + "==" + p["metadata"]["version"])' "$SITE.report.json")
  "$PY" -m pip install -q --no-deps --target "$SITE" "${pins[@]}"
  rm -f "$SITE.report.json"
  echo "mlflow-skinny==$MLFLOW_VERSION" > "$SITE/.installed"
fi
PYTHONPATH="$SITE" "$PY" -c "import mlflow" >/dev/null
