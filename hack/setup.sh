#!/usr/bin/env bash
# Installs everything the tests and the quickstart need, from the registries this project may reach,
# into .venv and $TRACEFLEET_CACHE. Idempotent: a warm cache makes it take seconds.
# Each part lives in hack/setup.d/ (Python packages, control-plane binaries, models, harness CLIs, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export TRACEFLEET_CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
mkdir -p "$TRACEFLEET_CACHE"
for part in hack/setup.d/*.sh; do
  echo "==> setup: ${part##*/}"
  start=$SECONDS
  bash "$part"
  echo "    (${part##*/}: $((SECONDS - start)) s)"
done
