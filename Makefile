# The front-door commands (README, "Two commands"; docs/quickstart.md): `make quickstart` runs the main job, `make train` the
# loop, `make test` the tests.
# Each installs only what it needs first (idempotent, cached under $(TRACEFLEET_CACHE)): the quickstart
# door skips the control-plane build, the harness CLIs, the S3 server and torch; the train door takes torch, vLLM
# and the harness CLIs but no control plane, S3 server, containers or browser (`hack/setup.sh --parts DOOR`).
SHELL := /bin/bash
export TRACEFLEET_CACHE ?= $(HOME)/.cache/tracefleet
VENV := .venv

.PHONY: setup setup-quickstart setup-train setup-images test quickstart train crd images

setup:
	bash hack/setup.sh test  # runs: $(shell bash hack/setup.sh --parts test)

setup-quickstart:
	bash hack/setup.sh quickstart  # runs: $(shell bash hack/setup.sh --parts quickstart)

setup-train:
	bash hack/setup.sh train  # runs: $(shell bash hack/setup.sh --parts train)

setup-images:
	bash hack/setup.sh images  # runs: $(shell bash hack/setup.sh --parts images)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

quickstart: setup-quickstart
	$(VENV)/bin/tracefleet run examples/quickstart/job.yaml

# The loop on this machine (docs/training/loop.md, "The loop on a laptop"): vLLM's CPU build, the job's sessions, a GRPO trainer.
train: setup-train
	$(VENV)/bin/tracefleet train examples/loop/job.yaml

crd:
	$(VENV)/bin/tracefleet crd

# Every image the chart and the operator name (docs/kubernetes/images.md), tagged REGISTRY/NAME:TAG:
#   make images REGISTRY=registry.example.com/team TAG=0.1.0 PUSH=1 [BASE=python:3.12-slim] [ONLY=tracefleet] [NO_CACHE=1]
REGISTRY ?= ghcr.io/tracefleet
images: setup-images
	$(VENV)/bin/tracefleet images build --registry $(REGISTRY) $(if $(TAG),--tag $(TAG)) $(if $(BASE),--base $(BASE)) \
	  $(foreach name,$(ONLY),--only $(name)) $(if $(PUSH),--push) $(if $(NO_CACHE),--no-cache)
