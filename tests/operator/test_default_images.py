"""The images a job runs when it names none: the operator's --harness-image (the chart passes its registry and tag)
fills spec.harness.image from the preset, a `command` harness runs in the tracefleet image, and the evaluator
image follows the harness image as it does for a named one. No cluster needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from fixtures.plans import plan_of
from tracefleet.contract.job import RolloutJob
from tracefleet.operator.config import DEFAULT_HARNESS_IMAGE, OperatorConfig
from tracefleet.operator.children.harness import harness_pod

REPO = Path(__file__).resolve().parents[2]
CFG = OperatorConfig(proxy_image="reg.example/team/tracefleet:1.2", evaluator_image="reg.example/team/tracefleet:1.2",
                     harness_image="reg.example/team/harness-{preset}:1.2")


def job(**harness: object) -> RolloutJob:
    return RolloutJob.model_validate({
        "apiVersion": "tracefleet.io/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"inference": {"external": {"baseUrl": "http://engine:8000"}},
                 "harness": harness,
                 "tasks": {"inline": [{"id": "t", "prompt": "p"}]},
                 "evaluator": {"preset": "command", "command": ["true"]},
                 "output": {"uri": "s3://bucket/prefix"}}})


def test_a_preset_gets_its_harness_image_and_the_evaluator_follows() -> None:
    filled = CFG.with_default_images(job(preset="codex"))
    assert filled.spec.harness.image == "reg.example/team/harness-codex:1.2"
    assert filled.spec.evaluator_image() == "reg.example/team/harness-codex:1.2"
    pod = harness_pod(filled, CFG, plan_of(filled, 0), 0).manifest
    assert pod["spec"]["containers"][0]["image"] == "reg.example/team/harness-codex:1.2"


def test_a_command_harness_runs_in_the_tracefleet_image_and_a_named_image_is_kept() -> None:
    assert CFG.with_default_images(job(preset="command", command=["python", "a.py"])).spec.harness.image == CFG.proxy_image
    assert CFG.with_default_images(job(command=["python", "a.py"])).spec.harness.image == CFG.proxy_image
    named = job(preset="pi", image="mine:1")
    assert CFG.with_default_images(named) is named
    # without --harness-image the job must name its image (the reconcile reports InvalidSpec)
    assert OperatorConfig().with_default_images(job(preset="pi")).spec.harness.image is None


def test_the_first_example_runs_on_the_defaults() -> None:
    example = RolloutJob.model_validate(yaml.safe_load((REPO / "examples" / "k8s" / "first-job.yaml").read_text()))
    assert example.spec.harness.image is None  # the chart's image.registry and image.tag decide it
    assert CFG.with_default_images(example).spec.harness.image == CFG.proxy_image
    assert DEFAULT_HARNESS_IMAGE.startswith("ghcr.io/tracefleet/harness-{preset}:")


def test_images_command_lists_names_and_refuses_an_unknown_one() -> None:
    run = [sys.executable, "-m", "tracefleet.cli", "images"]
    listed = subprocess.run([*run, "list", "--registry", "r.example/x/", "--tag", "t"], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.split()[:3] == [
        "r.example/x/tracefleet:t", "r.example/x/tracefleet-operator:t", "r.example/x/harness-codex:t"]
    bad = subprocess.run([*run, "build", "--only", "harness-vim"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "harness-vim" in bad.stderr


# The modules of what a job's pods run (the tracefleet image): `tracefleet proxy --in-pod` (the sidecar),
# `tracefleet run --in-pod` (the session program), `python -m tracefleet.runner.pod evaluate|seal` (evaluator and
# sealer Jobs), `tracefleet engine-gate` (a managed engine pod), through the CLI's own dispatch.
POD_PROGRAMS = ("tracefleet.cli", "tracefleet.proxy.cli", "tracefleet.runner.cli", "tracefleet.runner.pod",
                "tracefleet.proxy.engine_gate")


def test_the_pod_programs_import_neither_the_operator_nor_the_trainer() -> None:
    """The tracefleet image carries neither the operator's packages nor the trainer's (images/build.py): a pod
    program importing one would fail there. Here, where every package is installed, the import graph says so."""
    probe = (f"import sys; import {', '.join(POD_PROGRAMS)}; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'kopf', 'kubernetes', 'torch', 'tracefleet'}))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["['tracefleet']"], r.stdout + r.stderr


def test_the_first_example_seals_batches_with_a_real_model(cpu_engine, tmp_path: Path) -> None:
    """examples/k8s/first-job.yaml's agent and evaluator, run by `tracefleet run` (the session program a harness
    pod runs) against SmolLM2 on CPU: only the engine URL and the output (a directory, not the bucket) differ."""
    manifest = yaml.safe_load((REPO / "examples" / "k8s" / "first-job.yaml").read_text())
    manifest["spec"]["inference"]["external"]["baseUrl"] = cpu_engine.url
    manifest["spec"]["output"] = {"uri": str(tmp_path / "out"), "tracesPerBatch": 2}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    r = subprocess.run([sys.executable, "-m", "tracefleet.cli", "run", str(tmp_path / "job.yaml")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "completed 4" in r.stdout and "model calls    4" in r.stdout, r.stdout
    assert sorted(p.name for p in (tmp_path / "out" / "first-job" / "batches").iterdir()) == ["000000", "000001"]
