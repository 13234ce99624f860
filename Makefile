# The two front-door commands (README): `make quickstart` runs the main job, `make test` runs the tests.
# Both install what they need first (idempotent, cached under $(TRACEFLEET_CACHE)).
SHELL := /bin/bash
export TRACEFLEET_CACHE ?= $(HOME)/.cache/tracefleet
VENV := .venv

.PHONY: setup test quickstart crd

setup:
	bash hack/setup.sh

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

quickstart: setup
	$(VENV)/bin/tracefleet run examples/quickstart/job.yaml

crd:
	$(VENV)/bin/tracefleet crd
