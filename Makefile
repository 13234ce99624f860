# The two front-door commands (README): `make quickstart` runs the main job, `make test` runs the tests.
# Each installs only what it needs first (idempotent, cached under $(TRACEFLEET_CACHE)): the quickstart
# door skips the control-plane build, the harness CLIs, the S3 server and torch (`hack/setup.sh --parts`).
SHELL := /bin/bash
export TRACEFLEET_CACHE ?= $(HOME)/.cache/tracefleet
VENV := .venv

.PHONY: setup setup-quickstart setup-images test quickstart crd images

setup:
	bash hack/setup.sh test  # runs: $(shell bash hack/setup.sh --parts test)

setup-quickstart:
	bash hack/setup.sh quickstart  # runs: $(shell bash hack/setup.sh --parts quickstart)

setup-images:
	bash hack/setup.sh images  # runs: $(shell bash hack/setup.sh --parts images)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

quickstart: setup-quickstart
	$(VENV)/bin/tracefleet run examples/quickstart/job.yaml

crd:
	$(VENV)/bin/tracefleet crd

# Every image the chart and the operator name (docs/kubernetes/images.md), tagged REGISTRY/NAME:TAG:
#   make images REGISTRY=registry.example.com/team TAG=0.1.0 PUSH=1 [BASE=python:3.12-slim] [ONLY=tracefleet] [NO_CACHE=1]
REGISTRY ?= ghcr.io/tracefleet
images: setup-images
	$(VENV)/bin/tracefleet images build --registry $(REGISTRY) $(if $(TAG),--tag $(TAG)) $(if $(BASE),--base $(BASE)) \
	  $(foreach name,$(ONLY),--only $(name)) $(if $(PUSH),--push) $(if $(NO_CACHE),--no-cache)
