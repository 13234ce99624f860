#!/usr/bin/env bash
# doors: quickstart train test images
# The Python environment: the project (editable) with the extras the door needs: `local` (what
# `tracefleet run` needs here) for the quickstart, `local` and `trainer` (torch: the GRPO trainer of
# `tracefleet train`) for the train door, every extra the tests exercise for the tests.
set -euo pipefail
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
case "${TRACEFLEET_SETUP_DOOR:-test}" in
  quickstart) extras="local" ;;
  train) extras="local,trainer" ;;
  images) extras="local,operator" ;;  # images.build IMAGE_EXTRAS and OPERATOR_EXTRAS, at the versions installed here
  *) extras="local,test,operator" ;;
esac
.venv/bin/python -m pip install -q -e ".[$extras]"
