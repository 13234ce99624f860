#!/usr/bin/env bash
# doors: test
# background: yes
# The real Kubernetes control plane for tests (kube-apiserver, controller-manager, scheduler, etcd, kwok,
# kubectl, helm), built from Go modules into $TRACEFLEET_CACHE/controlplane/<version>/bin.
# Cold: tens of minutes on 2 cores; warm: a few seconds (every binary already cached).
set -euo pipefail
command -v go >/dev/null || { echo "go toolchain not found: install Go >= 1.25 (https://go.dev/dl/)" >&2; exit 1; }
exec bash "$(dirname "$0")/../controlplane/build.sh"
