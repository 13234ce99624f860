#!/usr/bin/env bash
# doors: test
# The real node the tests run pods on (tests/fixtures/node.py; ../shared/container-facts.md, "A real node"):
#   - containerd and the CNI plugins (bridge, host-local, loopback in /usr/lib/cni) from Debian's packages; runc and
#     podman come from 55-containers.sh, the kubelet from 30-controlplane.sh (the control plane's Go build);
#   - the pod sandbox ("pause") image: no registry is reachable, so hack/node/pause is built here into a one-file
#     image and saved as an archive the fixture imports into containerd, named and keyed by its source's hash;
#   - cluster DNS: CoreDNS with the few plugins the fixture's Corefile uses (hack/node/coredns; about 2 CPU-minutes
#     cold), keyed the same way, in a one-file image the fixture runs as the kube-dns pod;
#   - the NetworkPolicy enforcer: kube-router's network-policy controller (iptables and ipsets; hack/node/kube-router
#     names the module as a Go tool), built from the Go proxy and keyed the same way; ipset from Debian's package.
# Idempotent: a warm run checks four commands and four files. Writes $TRACEFLEET_CACHE/node/env
# (PAUSE_IMAGE=..., PAUSE_ARCHIVE=..., COREDNS=..., COREDNS_IMAGE=..., COREDNS_ARCHIVE=..., KUBE_ROUTER=...).
set -euo pipefail
: "${TRACEFLEET_CACHE:=$HOME/.cache/tracefleet}"
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$TRACEFLEET_CACHE/node"
mkdir -p "$root"

if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null || [ ! -x /usr/lib/cni/bridge ] \
    || ! command -v ipset >/dev/null; then
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
    || { echo "56-node: containerd or the CNI plugins missing: install them as root" \
              "(apt-get install -y containerd containernetworking-plugins ipset)" >&2; exit 1; }
  echo "    installing containerd containernetworking-plugins ipset (apt)"
  start=$SECONDS
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd containernetworking-plugins ipset \
    >"$root/apt.log" 2>&1 \
    || { tail -5 "$root/apt.log" >&2; echo "56-node: apt-get install containerd failed" >&2; exit 1; }
  echo "    apt: $((SECONDS - start)) s"
fi

export CONTAINERS_CONF="$TRACEFLEET_CACHE/containers/containers.conf"  # 55-containers.sh writes it

# one_file_image BINARY IMAGE ARCHIVE: BINARY as the whole image, saved as an archive the fixture imports
one_file_image() {
  local tmp name
  tmp=$(mktemp -d "$root/.image.XXXXXX")
  name=$(basename "${2%:*}")
  cp "$1" "$tmp/$name"
  printf 'FROM scratch\nCOPY %s /%s\nENTRYPOINT ["/%s"]\n' "$name" "$name" "$name" >"$tmp/Containerfile"
  podman --runtime runc build -q -t "$2" -f "$tmp/Containerfile" "$tmp" >/dev/null
  podman save -q -o "$tmp/image.tar" "$2"
  mv "$tmp/image.tar" "$3"
  rm -rf "$tmp"
}

src="$here/node/pause"
key=$(cat "$src/main.go" "$src/go.mod" | sha256sum | cut -c1-12)
image="localhost/tracefleet/pause:$key"
archive="$root/pause-$key.tar"
if [ ! -f "$archive" ]; then
  command -v go >/dev/null \
    || { echo "56-node: go toolchain not found (the pause image is built from hack/node/pause)" >&2; exit 1; }
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$root/pause.tmp" .)
  one_file_image "$root/pause.tmp" "$image" "$archive"
  rm -f "$root/pause.tmp"
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
dns_image="localhost/tracefleet/coredns:$dns_key"
dns_archive="$root/coredns-$dns_key.tar"
if [ ! -f "$dns_archive" ]; then
  one_file_image "$coredns" "$dns_image" "$dns_archive"
  echo "    built $dns_image ($dns_archive)"
fi

kr_src="$here/node/kube-router"
kr_key=$(cat "$kr_src/go.mod" "$kr_src/go.sum" | sha256sum | cut -c1-12)
kube_router="$root/kube-router-$kr_key"
if [ ! -x "$kube_router" ]; then
  start=$SECONDS
  (cd "$kr_src" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$kube_router.tmp" \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)
  mv "$kube_router.tmp" "$kube_router"
  echo "    built kube-router in $((SECONDS - start)) s ($kube_router)"
fi
# COREDNS (the binary) stays for checkouts whose fixture still runs it as a process: the cache is the machine's
printf 'PAUSE_IMAGE=%s\nPAUSE_ARCHIVE=%s\nCOREDNS=%s\nCOREDNS_IMAGE=%s\nCOREDNS_ARCHIVE=%s\nKUBE_ROUTER=%s\n' \
  "$image" "$archive" "$coredns" "$dns_image" "$dns_archive" "$kube_router" >"$root/env"
echo "    node ready: $(containerd --version | cut -d' ' -f1-3), $image ($root/env)"
