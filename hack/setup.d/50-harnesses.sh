#!/usr/bin/env bash
# doors: train test images
# The six real harness CLIs, pinned in runner/presets/pins.json, each installed from the npm registry into
# $TRACEFLEET_CACHE/harnesses/<name>-<version>/ (bin: node_modules/.bin/<bin>). Idempotent: an install is
# done into a temporary folder and renamed into place only when it succeeded, and a finished folder carries
# a .installed stamp, so a warm cache costs one `test -f` per harness.
# Transitive dependencies are pinned by runner/presets/locks/<name>.package-lock.json (npm install
# follows it). Writes $TRACEFLEET_CACHE/harnesses/bin.env (NAME_BIN=path lines) for shells and tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${TRACEFLEET_CACHE:=$HOME/.cache/tracefleet}"
root="$TRACEFLEET_CACHE/harnesses"
mkdir -p "$root"
# The train door takes them for `tracefleet train` with a real harness preset; its example loop (the command
# preset) does not need them, so there a machine without Node skips them with a word instead of failing.
if [ "${TRACEFLEET_SETUP_DOOR:-test}" = train ] && ! command -v npm >/dev/null; then
  echo "    skipped: no node/npm here (the harness presets need Node >= 20.6; examples/loop/job.yaml does not)"
  exit 0
fi
command -v npm >/dev/null && command -v node >/dev/null \
  || { echo "50-harnesses: node and npm are required (Node >= 20.6, e.g. apt-get install nodejs npm)" >&2; exit 1; }
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=6)?0:1)' \
  || { echo "50-harnesses: Node >= 20.6 is required, found $(node --version)" >&2; exit 1; }

mapfile -t pins < <(python3 - <<'PY'
import json
for name, pin in json.load(open("runner/presets/pins.json")).items():
    if not name.startswith("_"):
        print(name, pin["package"], pin["version"], pin["bin"])
PY
)

env_file="$root/bin.env.tmp"
: >"$env_file"
for line in "${pins[@]}"; do
  read -r name package version bin <<<"$line"
  dir="$root/$name-$version"
  if [ ! -f "$dir/.installed" ] || [ ! -x "$dir/node_modules/.bin/$bin" ]; then
    echo "    installing $package@$version"
    rm -rf "$root/.$name-$version".*  # leftovers of an interrupted install
    tmp="$(mktemp -d "$root/.$name-$version.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    printf '{"name": "tracefleet-harness-%s", "private": true, "dependencies": {"%s": "%s"}}\n' \
      "$name" "$package" "$version" >"$tmp/package.json"
    lock="runner/presets/locks/$name.package-lock.json"
    start=$SECONDS
    # The checked-in lockfile pins every transitive dependency too (npm install follows a lock it is given;
    # `npm ci` is stricter than npm's own lock-only output for nested optional platform packages).
    # A pin without a matching lock (a version bump) resolves afresh and says how to refresh the lock.
    if [ -f "$lock" ] && grep -q "\"$package\": \"$version\"" "$lock"; then
      cp "$lock" "$tmp/package-lock.json"
    else
      echo "    (no lockfile for $package@$version; refresh it with \`npm install --package-lock-only\` in a" \
           "folder holding that package.json, copied to $lock)" >&2
    fi
    cmd=(npm install)
    if ! (cd "$tmp" && "${cmd[@]}" --no-fund --no-audit --no-update-notifier --loglevel=error \
          >install.log 2>&1); then
      cat "$tmp/install.log" >&2
      rm -rf "$tmp"
      echo "50-harnesses: ${cmd[*]} $package@$version failed" >&2
      exit 1
    fi
    "$tmp/node_modules/.bin/$bin" --version >/dev/null 2>&1 </dev/null \
      || { rm -rf "$tmp"; echo "50-harnesses: $package@$version installed but \`$bin --version\` failed" >&2; exit 1; }
    echo "$package@$version" >"$tmp/.installed"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    trap - EXIT
    echo "    $name $version: $((SECONDS - start)) s, $(du -sh "$dir" | cut -f1)"
  fi
  var="$(echo "$name" | tr 'a-z-' 'A-Z_')_BIN"
  echo "$var=$dir/node_modules/.bin/$bin" >>"$env_file"
done
mv "$env_file" "$root/bin.env"
echo "    harnesses ready: $root/bin.env"
