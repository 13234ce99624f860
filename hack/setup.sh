#!/usr/bin/env bash
# Installs what one door needs, from the registries this project may reach, into .venv and $TRACEFLEET_CACHE.
#   hack/setup.sh quickstart   only what `tracefleet run examples/quickstart/job.yaml` needs (Python package,
#                              the CPU engine and its models): no control plane, harness CLIs, S3 server or torch
#   hack/setup.sh train        only what `tracefleet train` needs (Python package with torch, SmolLM2, vLLM's CPU
#                              build in its own venv, the harness CLIs where Node is): no control plane, S3 server,
#                              containers, browser or llama.cpp
#   hack/setup.sh [test]       everything the tests need (the default)
#   hack/setup.sh images       what `tracefleet images build` needs (`make images`): the Python package with the
#                              image's extras, the harness CLIs, podman and its base image
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
  case "$1" in quickstart|train|test|images) ;; *) echo "hack/setup.sh: unknown door '$1' (quickstart, train, test or images)" >&2; exit 2 ;; esac
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
# A part with a `# background: yes` line (the control-plane build: CPU for tens of minutes cold, nothing else
# needs it during setup) runs beside the parts after it, which mostly wait on downloads; its output goes to a
# log under the cache, and setup waits for it at the end and fails with its tail if it failed.
bg_pids=()
bg_names=()
bg_log() { echo "$TRACEFLEET_CACHE/setup-${1%.sh}.log"; }
stop_background() { local pid; for pid in "${bg_pids[@]}"; do pkill -TERM -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done; }
trap stop_background EXIT
for name in $(parts_of "$door"); do
  if grep -q '^# background: yes' "hack/setup.d/$name"; then
    echo "==> setup ($door): $name, in the background (log: $(bg_log "$name"))"
    ( start=$SECONDS; rc=0; bash "hack/setup.d/$name" >"$(bg_log "$name")" 2>&1 || rc=$?
      echo "    ($name: $((SECONDS - start)) s, in the background)" >>"$(bg_log "$name")"; exit "$rc" ) &
    bg_pids+=("$!")
    bg_names+=("$name")
    continue
  fi
  echo "==> setup ($door): $name"
  start=$SECONDS
  bash "hack/setup.d/$name"
  echo "    ($name: $((SECONDS - start)) s)"
done
for i in "${!bg_pids[@]}"; do
  name="${bg_names[$i]}"
  echo "==> setup ($door): waiting for $name"
  if ! wait "${bg_pids[$i]}"; then
    tail -20 "$(bg_log "$name")" >&2
    echo "hack/setup.sh: $name failed (log: $(bg_log "$name"))" >&2
    exit 1
  fi
  tail -1 "$(bg_log "$name")"
done
bg_pids=()
echo "==> setup ($door) done in $((SECONDS - total)) s"
