"""`tracefleet validate` and the real kube-apiserver agree: same manifests accepted, same ones refused,
each refusal naming the same field path. Schema errors and CEL rules are both in the table."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tracefleet.api import validate_manifest
from tracefleet.api.crd import CRD_FILENAME

REPO = Path(__file__).resolve().parents[2]
# Every RolloutJob manifest under examples/ (the top-level ones and those of the quickstart and k8s guides).
EXAMPLES = sorted(
    p for p in (REPO / "examples").rglob("*.yaml")
    if any(d.get("kind") == "RolloutJob" for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict))
)
CRD_PATH = REPO / "crds" / CRD_FILENAME
NAMESPACE = "foundation-validate"
TRACEFLEET = [sys.executable, "-m", "tracefleet"]


def _base() -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples" / "local-command.yaml").read_text())


def _managed(job: dict[str, Any]) -> dict[str, Any]:
    job["spec"]["inference"] = {"managed": {"model": "Qwen/Qwen3-4B"}}
    return job["spec"]["inference"]["managed"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(job: dict[str, Any]) -> None:
        node = job["spec"]
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return apply


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def apply(job: dict[str, Any]) -> None:
        node = job["spec"]
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        del node[last]

    return apply


def _do(*steps: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def apply(job: dict[str, Any]) -> None:
        for step in steps:
            step(job)

    return apply


def _rename(path: str, to: str) -> Callable[[dict[str, Any]], None]:
    def apply(job: dict[str, Any]) -> None:
        node = job["spec"]
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[to] = node.pop(last)

    return apply


def _name(value: str) -> Callable[[dict[str, Any]], None]:
    return lambda job: job["metadata"].update(name=value)


# (case id, kind of check, mutation of examples/local-command.yaml, field path both checkers must name)
INVALID: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    ("output-missing", "schema", _delete("output"), "spec.output"),
    ("parallelism-zero", "schema", _set("parallelism", 0), "spec.parallelism"),
    ("parallelism-string", "schema", _set("parallelism", "2"), "spec.parallelism"),
    ("suspend-string", "schema", _set("suspend", "yes"), "spec.suspend"),
    ("unknown-field", "schema", _set("harness.colour", "blue"), "spec.harness.colour"),
    ("builder-enum", "schema", _set("output.builder", "per-session"), "spec.output.builder"),
    ("harness-preset-enum", "schema", _set("harness.preset", "cursor"), "spec.harness.preset"),
    ("capture-mode-enum", "schema", _set("inference.capture.mode", "approx"), "spec.inference.capture.mode"),
    ("samples-zero", "schema", _set("tasks.samplesPerTask", 0), "spec.tasks.samplesPerTask"),
    ("task-without-prompt", "schema", _set("tasks.inline", [{"id": "t1"}]), "spec.tasks.inline[0].prompt"),
    ("task-duplicate-id", "schema",
     _set("tasks.inline", [{"id": "t1", "prompt": "a"}, {"id": "t1", "prompt": "b"}]), "spec.tasks.inline[1]"),
    ("quantity-garbage", "schema", _set("harness.resources", {"limits": {"cpu": "lots"}}), "spec.harness.resources.limits.cpu"),
    ("base-url-scheme", "schema", _set("inference.external.baseUrl", "ftp://engine:21"), "spec.inference.external.baseUrl"),
    ("evaluator-timeout-negative", "schema", _set("evaluator.timeoutSeconds", -1), "spec.evaluator.timeoutSeconds"),
    ("ttl-negative", "schema", _set("ttlSecondsAfterFinished", -5), "spec.ttlSecondsAfterFinished"),
    ("webhook-url", "schema", _set("trainer", {"webhook": {"url": "trainer:8080"}}), "spec.trainer.webhook.url"),
    ("inference-both", "cel", _set("inference.managed", {"model": "Qwen/Qwen3-4B"}), "spec.inference"),
    ("inference-neither", "cel", _delete("inference.external"), "spec.inference"),
    ("tasks-two-sources", "cel", _set("tasks.uri", "s3://datasets/tasks.jsonl"), "spec.tasks"),
    ("tasks-no-source", "cel", _delete("tasks.inline"), "spec.tasks"),
    ("harness-neither", "cel", _do(_delete("harness.preset"), _delete("harness.command")), "spec.harness"),
    ("harness-preset-and-command", "cel", _set("harness.preset", "codex"), "spec.harness.command"),
    ("harness-command-preset-without-command", "cel", _delete("harness.command"), "spec.harness.command"),
    ("output-uri-scheme", "cel", _set("output.uri", "gs://bucket/prefix"), "spec.output.uri"),
    ("output-uri-empty-bucket", "cel", _set("output.uri", "s3://"), "spec.output.uri"),
    ("tasks-uri-scheme", "cel",
     _do(_delete("tasks.inline"), _set("tasks.uri", "https://example.com/tasks.jsonl")), "spec.tasks.uri"),
    ("tasks-harbor-and-inline", "cel", _set("tasks.harbor", {"uri": "harbor-tasks/"}), "spec.tasks"),
    ("tasks-harbor-uri-scheme", "cel",
     _do(_delete("tasks.inline"), _set("tasks.harbor", {"uri": "gs://datasets/tb2"})), "spec.tasks.harbor.uri"),
    ("tasks-harbor-include-empty", "schema",
     _do(_delete("tasks.inline"), _set("tasks.harbor", {"uri": "s3://datasets/tb2", "include": []})),
     "spec.tasks.harbor.include"),
    ("gpus-below-tp", "cel",
     lambda job: _managed(job).update(tensorParallelSize=4, gpusPerReplica=2), "spec.inference.managed.gpusPerReplica"),
    ("evaluator-hook-without-entrypoint", "cel", _set("evaluator", {"preset": "hook"}), "spec.evaluator.entryPoint"),
    ("evaluator-tests-with-command", "cel", _set("evaluator.preset", "tests"), "spec.evaluator.command"),
    # the model's Python names are not the CRD's: `tracefleet run` used to honour this one
    ("snake-case-field", "schema", _rename("tasks.samplesPerTask", "samples_per_task"), "spec.tasks.samples_per_task"),
    ("name-not-rfc1123", "schema", _name("Quick_Start"), "metadata.name"),
    # a valid subdomain, but the tracefleet.io/job label every child carries holds at most 63 characters
    ("name-too-long-for-labels", "schema", _name("a" * 64), "metadata.name"),
    # the managed engine's Service, `<name>-inference`, is an RFC 1035 label
    ("name-managed-starts-with-digit", "cel",
     _do(_name("1job"), _delete("inference.external"), _set("inference.managed", {"model": "Qwen/Qwen3-4B"})),
     "metadata.name"),
]
IDS = [case[0] for case in INVALID]


def _manifest(case_id: str) -> dict[str, Any]:
    _, _, mutate, _ = next(c for c in INVALID if c[0] == case_id)
    job = _base()
    job["metadata"]["name"] = case_id
    mutate(job)
    return job


def test_table_is_broad() -> None:
    assert len(INVALID) >= 15 and len(set(IDS)) == len(IDS)
    assert sum(1 for c in INVALID if c[1] == "schema") >= 8
    assert sum(1 for c in INVALID if c[1] == "cel") >= 8


def test_base_manifest_is_valid() -> None:
    assert validate_manifest(_base()) == []


@pytest.mark.parametrize("case_id", IDS)
def test_validate_names_the_field(case_id: str) -> None:
    expected = next(c[3] for c in INVALID if c[0] == case_id)
    problems = validate_manifest(_manifest(case_id))
    assert expected in [p.path for p in problems], problems
    # One broken thing gives one problem, not a cascade.
    assert len(problems) == 1, problems


def test_validate_cli_prints_every_problem(tmp_path: Path) -> None:
    files = []
    for case_id in IDS:
        f = tmp_path / f"{case_id}.yaml"
        f.write_text(yaml.safe_dump(_manifest(case_id)))
        files.append(str(f))
    proc = subprocess.run([*TRACEFLEET, "validate", *files], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    for case_id, _, _, expected in INVALID:
        lines = [l for l in proc.stdout.splitlines() if l.startswith(f"{tmp_path / case_id}.yaml: ")]
        assert any(l.split(": ", 2)[1] == expected for l in lines), (case_id, lines)


def test_validate_cli_accepts_the_examples() -> None:
    assert len(EXAMPLES) >= 4
    proc = subprocess.run([*TRACEFLEET, "validate", *map(str, EXAMPLES)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count(": ok") == len(EXAMPLES)


def test_validate_cli_reads_multi_document_files_and_stdin(tmp_path: Path) -> None:
    good = (REPO / "examples" / "local-command.yaml").read_text()
    bad = yaml.safe_dump(_manifest("parallelism-zero"))
    proc = subprocess.run([*TRACEFLEET, "validate", "-"], input=good + "\n---\n" + bad,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout.startswith("-[1]: spec.parallelism: "), proc.stdout
    missing = subprocess.run([*TRACEFLEET, "validate", str(tmp_path / "nope.yaml")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "cannot read" in missing.stdout


# ---------------------------------------------------------------- the real kube-apiserver


@pytest.fixture(scope="module")
def cluster(kube: Any) -> Any:
    def ok(proc: subprocess.CompletedProcess) -> None:
        assert proc.returncode == 0, proc.stderr

    ok(kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH)))
    ok(kube.kubectl("wait", "--for=condition=Established", "crd/rolloutjobs.tracefleet.io", "--timeout=60s"))
    ok(kube.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})))
    deadline = time.monotonic() + 30
    while kube.kubectl("get", "rj", "-n", NAMESPACE).returncode != 0:
        assert time.monotonic() < deadline, "rolloutjobs never became discoverable"
        time.sleep(0.5)
    return kube


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO / "examples")))
def test_apiserver_accepts_the_examples(cluster: Any, path: Path) -> None:
    jobs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == "RolloutJob"]
    for job in jobs:
        job["metadata"]["namespace"] = NAMESPACE  # guides may name their own namespace
        proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(job))
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.strip() == "", f"apiserver warned (pruned fields?): {proc.stderr}"


@pytest.mark.parametrize("case_id", IDS)
def test_apiserver_rejects_with_the_same_field(cluster: Any, case_id: str) -> None:
    expected = next(c[3] for c in INVALID if c[0] == case_id)
    proc = cluster.kubectl("create", "--dry-run=server", "-n", NAMESPACE, "-f", "-", input=json.dumps(_manifest(case_id)))
    assert proc.returncode != 0, f"apiserver accepted {case_id}"
    # `spec.x: Invalid value…`, `spec.x: Required value`, or for unknown fields `unknown field "spec.x"`.
    assert re.search(re.escape(expected) + r'(: |")', proc.stderr), proc.stderr
    if next(c[1] for c in INVALID if c[0] == case_id) == "cel":
        # CEL rules: the apiserver says what `tracefleet validate` says, word for word (one rule table).
        (problem,) = [p for p in validate_manifest(_manifest(case_id)) if p.path == expected]
        assert f"{expected}: Invalid value: {problem.message}" in proc.stderr, proc.stderr


def test_messages_name_the_crd_field_and_the_given_value() -> None:
    (snake,) = validate_manifest(_manifest("snake-case-field"))
    assert "samplesPerTask" in snake.message, snake
    (typed,) = validate_manifest(_manifest("parallelism-string"))
    assert typed.message.endswith("got '2'"), typed
    (name,) = validate_manifest(_manifest("name-not-rfc1123"))
    assert "RFC 1123" in name.message and "'Quick_Start'" in name.message, name


def test_path_problems_come_with_the_schema_problems(tmp_path: Path) -> None:
    job = _manifest("parallelism-zero")
    job["spec"]["tasks"]["inline"][0]["workspace"] = {"repo": "no-such-repo"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "local_agent.py").write_text("")  # the agent it names is there
    proc = subprocess.run([*TRACEFLEET, "validate", "job.yaml"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    paths = [line.split(": ")[1] for line in proc.stdout.splitlines()]
    assert paths == ["spec.parallelism", "spec.tasks.inline[0].workspace.repo"], proc.stdout


def test_run_refuses_what_validate_refuses(tmp_path: Path) -> None:
    """`tracefleet run` reads the job through the same check: the snake_case field is refused before anything starts."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_manifest("snake-case-field")))
    (tmp_path / "local_agent.py").write_text("")  # the agent it names is there
    proc = subprocess.run([*TRACEFLEET, "run", "job.yaml"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("tracefleet run: job.yaml: spec.tasks.samples_per_task: unknown field: the RolloutJob "
                                   "spells it samplesPerTask (camelCase, as the CRD does)"), proc.stderr
