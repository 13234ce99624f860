#!/usr/bin/env bash
# doors: test
# tracefleet.trainer.bridges: the `bridges` extra (TRL, whose GRPOTrainer the TRL bridge's test runs on CPU, and
# the Tinker API client, whose types the Tinker bridge builds). Both install beside torch (20-traces.sh) without
# changing a version already in .venv. Idempotent: when both are present this only checks them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "25-bridges.sh: .venv missing (10-python.sh creates it)" >&2; exit 1; }
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}/pip}"
if ! "$PY" -c "import trl, tinker" 2>/dev/null; then
  echo "    installing the bridges extra (trl, tinker)"
  "$PY" -m pip install -q "trl==1.16.0" "tinker==0.24.1"
fi
"$PY" -c "import trl, tinker, datasets" >/dev/null
