# The two front-door commands (README): `make quickstart` runs the main job, `make test` runs the tests.
# Each installs only what it needs first (idempotent, cached under $(TRACEFLEET_CACHE)): the quickstart
# door skips the control-plane build, the harness CLIs, the S3 server and torch (`hack/setup.sh --parts`).
SHELL := /bin/bash
export TRACEFLEET_CACHE ?= $(HOME)/.cache/tracefleet
VENV := .venv

.PHONY: setup setup-quickstart test quickstart crd

setup:
	bash hack/setup.sh test  # runs: $(shell bash hack/setup.sh --parts test)

setup-quickstart:
	bash hack/setup.sh quickstart  # runs: $(shell bash hack/setup.sh --parts quickstart)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

quickstart: setup-quickstart
	$(VENV)/bin/tracefleet run examples/quickstart/job.yaml

crd:
	$(VENV)/bin/tracefleet crd
