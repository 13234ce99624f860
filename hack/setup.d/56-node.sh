#!/usr/bin/env bash
# doors: test
# The real node the tests run pods on (tests/fixtures/node.py; ../shared/container-facts.md, "A real node"):
#   - containerd and the CNI plugins (bridge, host-local, loopback in /usr/lib/cni) from Debian's packages; runc and
#     podman come from 55-containers.sh, the kubelet from 30-controlplane.sh (the control plane's Go build);
#   - the pod sandbox ("pause") image: no registry is reachable, so hack/node/pause is built here into a one-file
#     image and saved as an archive the fixture imports into containerd, named and keyed by its source's hash;
#   - cluster DNS: CoreDNS with the few plugins the fixture's Corefile uses (hack/node/coredns; about 2 CPU-minutes
#     cold), keyed the same way.
# Idempotent: a warm run checks two commands and two files. Writes $TRACEFLEET_CACHE/node/env
# (PAUSE_IMAGE=..., PAUSE_ARCHIVE=..., COREDNS=...).
set -euo pipefail
: "${TRACEFLEET_CACHE:=$HOME/.cache/tracefleet}"
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$TRACEFLEET_CACHE/node"
mkdir -p "$root"

if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null || [ ! -x /usr/lib/cni/bridge ]; then
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
    || { echo "56-node: containerd or the CNI plugins missing: install them as root" \
              "(apt-get install -y containerd containernetworking-plugins)" >&2; exit 1; }
  echo "    installing containerd containernetworking-plugins (apt)"
  start=$SECONDS
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd containernetworking-plugins \
    >"$root/apt.log" 2>&1 \
    || { tail -5 "$root/apt.log" >&2; echo "56-node: apt-get install containerd failed" >&2; exit 1; }
  echo "    apt: $((SECONDS - start)) s"
fi

src="$here/node/pause"
key=$(cat "$src/main.go" "$src/go.mod" | sha256sum | cut -c1-12)
image="localhost/tracefleet/pause:$key"
archive="$root/pause-$key.tar"
if [ ! -f "$archive" ]; then
  command -v go >/dev/null \
    || { echo "56-node: go toolchain not found (the pause image is built from hack/node/pause)" >&2; exit 1; }
  export CONTAINERS_CONF="$TRACEFLEET_CACHE/containers/containers.conf"  # 55-containers.sh writes it
  tmp=$(mktemp -d "$root/.pause.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/pause" .)
  printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$tmp/Containerfile"
  podman --runtime runc build -q -t "$image" -f "$tmp/Containerfile" "$tmp" >/dev/null
  podman save -q -o "$tmp/pause.tar" "$image"
  mv "$tmp/pause.tar" "$archive"
  echo "    built $image ($archive)"
fi
dns_src="$here/node/coredns"
dns_key=$(cat "$dns_src/main.go" "$dns_src/go.mod" "$dns_src/go.sum" | sha256sum | cut -c1-12)
coredns="$root/coredns-$dns_key"
if [ ! -x "$coredns" ]; then
  start=$SECONDS
  (cd "$dns_src" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$coredns.tmp" .)
  mv "$coredns.tmp" "$coredns"
  echo "    built CoreDNS in $((SECONDS - start)) s ($coredns)"
fi
printf 'PAUSE_IMAGE=%s\nPAUSE_ARCHIVE=%s\nCOREDNS=%s\n' "$image" "$archive" "$coredns" >"$root/env"
echo "    node ready: $(containerd --version | cut -d' ' -f1-3), $image ($root/env)"
