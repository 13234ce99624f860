#!/usr/bin/env bash
# doors: test
# A real Tinker-API server for the Tinker bridge's test: SkyRL's `skyrl.tinker.api` with its JAX backend on CPU,
# in its own venv under the cache ($TRACEFLEET_CACHE/skyrl/venv; Python 3.12: SkyRL's types need
# typing_extensions' TypedDict on older Pythons; tinker 0.24.1, the newest client it speaks). SkyRL expects a
# uv project checkout: its API server must be started as `uv run -m skyrl.tinker.api` and starts its engine as
# `uv run ... -m skyrl.tinker.engine`; $TRACEFLEET_CACHE/skyrl/bin/uv runs such a module with the venv's python. Idempotent: a finished venv carries a .installed stamp. Cold: about
# 3 GB downloaded (torch and its CUDA libraries, which peft pulls in, and jax), a ~6 GB venv; uv's package cache is shared (hack/uv.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
SKYRL_VERSION=0.3.0
ROOT="$CACHE/skyrl"
VENV="$ROOT/venv"
source "$(dirname "${BASH_SOURCE[0]}")/../uv.sh"  # uv_bin, UV_CACHE_DIR

source "$(dirname "${BASH_SOURCE[0]}")/../python312.sh"  # find_python312

if [ ! -f "$VENV/.installed" ]; then
  uv=$(uv_bin)
  py=$(find_python312) || { echo "47-skyrl: Python 3.12 not found (SkyRL's Tinker-API server needs it)" >&2; exit 1; }
  echo "    installing skyrl[tinker,jax] $SKYRL_VERSION into $VENV"
  start=$SECONDS
  rm -rf "$VENV"
  "$uv" venv -q --python "$py" "$VENV"
  "$uv" pip install -q --python "$VENV/bin/python" "skyrl[tinker,jax]==$SKYRL_VERSION" "jax[cpu]" "tinker==0.24.1"
  touch "$VENV/.installed"
  echo "    skyrl venv: $((SECONDS - start)) s"
fi
mkdir -p "$ROOT/bin"
cat > "$ROOT/bin/uv" <<'SHIM'
#!/usr/bin/env bash
# `uv run <flags> -m MODULE ARGS` runs the module with the venv's python, as a child: SkyRL's API server reads
# its parent's command line for the `uv run` flags it starts its engine with
while [ $# -gt 0 ] && [ "$1" != "-m" ]; do shift; done
"$(dirname "$0")/../venv/bin/python" "$@"
SHIM
chmod +x "$ROOT/bin/uv"
"$VENV/bin/python" -c "import skyrl.tinker.api, jax" >/dev/null
