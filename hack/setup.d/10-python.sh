#!/usr/bin/env bash
# The Python environment: the project (editable) with every extra the tests exercise.
set -euo pipefail
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q -e '.[test,operator]'
