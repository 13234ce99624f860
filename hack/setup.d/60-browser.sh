#!/usr/bin/env bash
# doors: test
# A real headless browser for the test that opens `tracefleet traces show --html` pages as a person would:
# Debian's Chromium (apt). Only the tests need it; the quickstart door skips it. Idempotent: one
# `command -v` when it is there. Without root, install it yourself (apt-get install chromium).
set -euo pipefail
for bin in chromium chromium-browser; do
  if command -v "$bin" >/dev/null; then exit 0; fi
done
command -v apt-get >/dev/null \
  || { echo "60-browser: Chromium not found and no apt-get: install Chromium (the trace-page test opens it)" >&2; exit 1; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "    installing chromium (apt)"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
