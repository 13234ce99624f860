#!/usr/bin/env bash
# Installs what one door needs, from the registries this project may reach, into .venv and $TRACEFLEET_CACHE.
#   hack/setup.sh quickstart   only what `tracefleet run examples/quickstart/job.yaml` needs (Python package,
#                              the CPU engine and its models): no control plane, harness CLIs, S3 server or torch
#   hack/setup.sh [test]       everything the tests need (the default)
#   hack/setup.sh --parts DOOR print the parts DOOR runs, one line, and exit
# Each part lives in hack/setup.d/ and names the doors it serves in a `# doors: …` line; a part without
# one serves `test` only. Idempotent: a warm cache makes it take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

parts_of() {  # the parts a door runs, in order
  local part doors
  for part in hack/setup.d/*.sh; do
    doors=$(sed -n 's/^# doors: *//p' "$part" | head -1)
    case " ${doors:-test} " in *" $1 "*) echo "${part##*/}" ;; esac
  done
}

check_door() {
  case "$1" in quickstart|test) ;; *) echo "hack/setup.sh: unknown door '$1' (quickstart or test)" >&2; exit 2 ;; esac
}

if [ "${1:-}" = "--parts" ]; then
  check_door "${2:-test}"
  parts_of "${2:-test}" | paste -sd' ' -
  exit 0
fi
door="${1:-test}"
check_door "$door"
export TRACEFLEET_SETUP_DOOR="$door"  # parts that install differently per door read it (10-python.sh)
export TRACEFLEET_CACHE="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
mkdir -p "$TRACEFLEET_CACHE"
total=$SECONDS
for name in $(parts_of "$door"); do
  echo "==> setup ($door): $name"
  start=$SECONDS
  bash "hack/setup.d/$name"
  echo "    ($name: $((SECONDS - start)) s)"
done
echo "==> setup ($door) done in $((SECONDS - total)) s"
