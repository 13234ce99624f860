#!/usr/bin/env bash
# Builds the test control plane from Go modules into $TRACEFLEET_CACHE/controlplane/$KUBERNETES_VERSION/bin:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, (k8s.io/kubernetes, wrapper module ./kubernetes)
#   kubelet, kube-proxy                                                (the real node: tests/fixtures/node.py)
#   etcd                                                               (go.etcd.io/etcd/server/v3, wrapper module ./etcd)
#   kwok, kwokctl                                                      (sigs.k8s.io/kwok)
#   helm                                                               (helm.sh/helm/v3)
# Idempotent: a binary already in the cache is kept; a cold build takes tens of minutes on 2 cores
# (GOMODCACHE/GOCACHE stay at Go's defaults so a rebuild reuses them). Writes build-info.txt with timings and sizes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=/dev/null
source "$here/versions.env"
cache="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}"
bin="$cache/controlplane/$KUBERNETES_VERSION/bin"
mkdir -p "$bin"
info="$bin/../build-info.txt"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export CGO_ENABLED=0
nice_go() { nice -n 10 go "$@"; }

missing() { local b; for b in "$@"; do [[ -x "$bin/$b" ]] || return 0; done; return 1; }
record() { echo "$(date -u +%FT%TZ) $*" | tee -a "$info"; }

# The wrapper modules are checked in (go.sum pins every download); they must match versions.env.
grep -q "^require k8s.io/kubernetes $KUBERNETES_VERSION\$" "$here/kubernetes/go.mod" || {
  echo "hack/controlplane/kubernetes/go.mod is not for $KUBERNETES_VERSION: run hack/controlplane/gen-kubernetes-mod.sh" >&2
  exit 1
}
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION\$" "$here/etcd/go.mod" || {
  echo "hack/controlplane/etcd/go.mod is not for $ETCD_VERSION: run (cd hack/controlplane/etcd && go get go.etcd.io/etcd/server/v3@$ETCD_VERSION && go mod tidy)" >&2
  exit 1
}

minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION \
-X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
if missing "${k8s_bins[@]}"; then
  start=$SECONDS
  tmp="$(mktemp -d "$bin/.build.XXXXXX")"
  # One invocation so the shared packages (apiserver, client-go, ...) compile once.
  (cd "$here/kubernetes" && nice_go build -trimpath -ldflags "$k8s_ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy)
  mv "$tmp"/* "$bin/" && rmdir "$tmp"
  record "built ${k8s_bins[*]} $KUBERNETES_VERSION in $((SECONDS - start)) s"
fi

if missing etcd; then
  start=$SECONDS
  (cd "$here/etcd" && nice_go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" . && mv "$bin/etcd.tmp" "$bin/etcd")
  record "built etcd $ETCD_VERSION in $((SECONDS - start)) s"
fi

if missing kwok kwokctl; then
  start=$SECONDS
  GOBIN="$bin" nice_go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  record "built kwok kwokctl $KWOK_VERSION in $((SECONDS - start)) s"
fi

if missing helm; then
  start=$SECONDS
  GOBIN="$bin" nice_go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  record "built helm $HELM_VERSION in $((SECONDS - start)) s"
fi

(cd "$bin" && du -h kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok kwokctl helm) > "$bin/../sizes.txt"
echo "control plane binaries in $bin:"; sed 's/^/  /' "$bin/../sizes.txt"
