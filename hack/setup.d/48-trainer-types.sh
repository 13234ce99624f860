#!/usr/bin/env bash
# doors: test
# The trainers' own rollout types for the bridge adapters' test (tests/trainer/test_bridges_adapters.py): verl's
# AgentLoopOutput (verl 0.9.1 from the package index; it imports cachetools without declaring it) and Miles' Sample
# (the released miles-rl 0.0.2), in their own venv under the cache ($TRACEFLEET_CACHE/trainer-types/venv): verl
# pins transformers and ray versions the project's .venv does not hold. prime-rl is not on the package index (its
# TrainingSample is a msgspec Struct: msgspec is installed for the adapter's check of its fields). Idempotent: a
# finished venv carries a .installed stamp. Cold: about 1 GB downloaded (ray, verl's other dependencies; torch is
# linked from uv's shared package cache: hack/uv.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
VENV="$CACHE/trainer-types/venv"
PACKAGES=("verl==0.9.1" "cachetools" "miles-rl==0.0.2" "msgspec" "httpx")
source "$(dirname "${BASH_SOURCE[0]}")/../uv.sh"  # uv_bin, UV_CACHE_DIR

if [ ! -f "$VENV/.installed" ] || [ "$(cat "$VENV/.installed")" != "${PACKAGES[*]}" ]; then
  uv=$(uv_bin)
  echo "    installing ${PACKAGES[*]} into $VENV"
  start=$SECONDS
  rm -rf "$VENV"
  "$uv" venv -q --python .venv/bin/python "$VENV"
  "$uv" pip install -q --python "$VENV/bin/python" "${PACKAGES[@]}"
  echo "${PACKAGES[*]}" > "$VENV/.installed"
  echo "    trainer types venv: $((SECONDS - start)) s"
fi
"$VENV/bin/python" -c "import verl.experimental.agent_loop.agent_loop, miles, msgspec" >/dev/null
