#!/usr/bin/env bash
# doors: test
# The docs site's tools: mkdocs and Material for MkDocs, pinned in docs/requirements.txt, in their own venv
# ($TRACEFLEET_CACHE/docs/venv) so their pins never meet the project's. The tests build the site with it
# (`mkdocs build --strict`: broken links and anchors fail). Idempotent: the venv keeps a copy of the
# requirements it was made from, and is made again only when they changed (cold: ~15 s, 30 MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}/docs/venv"
stamp="$venv/requirements.txt"
if cmp -s docs/requirements.txt "$stamp"; then
  exit 0
fi
echo "    installing the docs tools (docs/requirements.txt) into $venv"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-${TRACEFLEET_CACHE:-$HOME/.cache/tracefleet}/pip}"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r docs/requirements.txt
"$venv/bin/mkdocs" --version >/dev/null
cp docs/requirements.txt "$stamp"
