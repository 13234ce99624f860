#!/usr/bin/env bash
# doors: test images
# Real containers for Harbor task folders (../shared/container-facts.md says what works on these machines):
#   - podman, runc and debootstrap from Debian's packages (no registry is reachable, so no image is pulled);
#   - $TRACEFLEET_CACHE/containers/containers.conf without default ulimits (the runtime may not raise them
#     inside this container); runner/containers/runtime.py passes it as CONTAINERS_CONF with `--runtime runc`;
#   - the base image localhost/debian:bookworm, made once with debootstrap (minbase, from the mirror apt already
#     uses) and cached as a rootfs tarball, so a warm run only imports it (or finds it already in podman);
#   - $TRACEFLEET_CACHE/harbor-venv-<version>/: Python 3.12 with the `harbor` wheel, which the tests use to check
#     our task.toml parsing against Harbor's own TaskConfig. Never a dependency of tracefleet itself. Installed
#     --no-deps plus what harbor.models.task imports (pydantic, toml, pathspec): the wheel's full dependency set
#     (litellm, supabase, fastmcp, ...) is for running Harbor, not for reading its task models.
# Idempotent; writes $TRACEFLEET_CACHE/containers/env (CONTAINERS_CONF=..., HARBOR_PYTHON=...).
set -euo pipefail
: "${TRACEFLEET_CACHE:=$HOME/.cache/tracefleet}"
root="$TRACEFLEET_CACHE/containers"
mkdir -p "$root"
BASE_IMAGE="localhost/debian:bookworm"
HARBOR_VERSION="0.26.0"

missing=()
for bin in podman runc debootstrap; do command -v "$bin" >/dev/null || missing+=("$bin"); done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
    || { echo "55-containers: ${missing[*]} missing: install them as root (apt-get install -y podman runc debootstrap)" >&2; exit 1; }
  echo "    installing podman runc debootstrap (apt)"
  start=$SECONDS
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >"$root/apt.log" 2>&1 \
    || { tail -5 "$root/apt.log" >&2; echo "55-containers: apt-get install podman runc debootstrap failed" >&2; exit 1; }
  echo "    apt: $((SECONDS - start)) s"
fi

conf="$root/containers.conf"
printf '[containers]\ndefault_ulimits = []\n' >"$conf.tmp" && mv "$conf.tmp" "$conf"
export CONTAINERS_CONF="$conf"
podman_() { podman --runtime runc "$@"; }

rootfs="$root/debian-bookworm-minbase.tar"
if ! podman_ image exists "$BASE_IMAGE"; then
  if [ ! -f "$rootfs" ]; then
    # The mirror apt already reaches (a registry-free machine still has its Debian mirror).
    mirror=$(apt-get indextargets --format '$(SITE) $(RELEASE)' 2>/dev/null | awk '$2 == "bookworm" {print $1; exit}')
    mirror=${mirror:-http://deb.debian.org/debian}
    echo "    debootstrap --variant=minbase bookworm from $mirror"
    start=$SECONDS
    tmp=$(mktemp -d "$root/.rootfs.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$root/debootstrap.log" 2>&1 \
      || { tail -5 "$root/debootstrap.log" >&2; echo "55-containers: debootstrap failed (log: $root/debootstrap.log)" >&2; exit 1; }
    # apt's download cache is of no use inside task images and is half the tarball.
    rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
    tar -C "$tmp/root" -cf "$tmp/rootfs.tar" .
    mv "$tmp/rootfs.tar" "$rootfs"
    rm -rf "$tmp"
    trap - EXIT
    echo "    debootstrap: $((SECONDS - start)) s, $(du -h "$rootfs" | cut -f1)"
  fi
  podman_ import -q "$rootfs" "$BASE_IMAGE" >/dev/null
  echo "    imported $BASE_IMAGE from $rootfs"
fi

source "$(dirname "${BASH_SOURCE[0]}")/../python312.sh"  # find_python312
venv="$TRACEFLEET_CACHE/harbor-venv-$HARBOR_VERSION"
if [ "${TRACEFLEET_SETUP_DOOR:-test}" = images ]; then
  :  # the image build needs podman and the base image only
elif [ ! -f "$venv/.installed" ]; then
  py=$(find_python312) || { echo "55-containers: Python 3.12 not found (harbor $HARBOR_VERSION needs it)" >&2; exit 1; }
  start=$SECONDS
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "pydantic>=2.14" "toml>=0.10.2" "pathspec>=1.0.3"
  "$venv/bin/python" -m pip install -q --no-deps "harbor==$HARBOR_VERSION"
  "$venv/bin/python" -c 'import harbor.models.task.task, harbor.models.task.paths' \
    || { echo "55-containers: harbor $HARBOR_VERSION installed but its task models do not import" >&2; exit 1; }
  echo "harbor==$HARBOR_VERSION" >"$venv/.installed"
  echo "    harbor venv: $((SECONDS - start)) s"
fi

printf 'CONTAINERS_CONF=%s\nHARBOR_PYTHON=%s\n' "$conf" "$venv/bin/python" >"$root/env"
echo "    containers ready: $(podman --version), $BASE_IMAGE, harbor $HARBOR_VERSION ($root/env)"
