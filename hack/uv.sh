# Sourced by the setup parts that install with uv (torch for the tests, vLLM's venv, SkyRL's): uv_bin prints the
# path of uv $UV_VERSION under the cache, installing it there the first time. Its package cache,
# $TRACEFLEET_CACHE/uv, is shared by every venv it fills: uv links a package from it rather than unpacking it
# again, so a second clone's torch (about 5 GB unpacked, with its CUDA libraries) costs seconds and almost no disk.
UV_VERSION=0.13.9
export UV_CACHE_DIR="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}/uv"
uv_bin() {
  local tools="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}/tools/uv-$UV_VERSION"
  [ -x "$tools/bin/uv" ] || { rm -rf "$tools"; python3 -m venv "$tools" && "$tools/bin/pip" install -q "uv==$UV_VERSION" >&2; }
  echo "$tools/bin/uv"
}
