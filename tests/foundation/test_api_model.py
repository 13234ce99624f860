"""The RolloutJob model: YAML <-> model round trips, wire names, defaults, strictness, helpers."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tracefleet.api import DEFAULT_VLLM_IMAGE, RolloutJob, job_from_yaml, job_to_yaml, load_job, validate_manifest, validate_update

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml")) + sorted((REPO / "examples" / "k8s").glob("*.yaml"))


def _subset(small: object, big: object) -> bool:
    """Every key/value of `small` is in `big` (lists element-wise): what the user wrote survives."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _subset(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(small) == len(big) and all(_subset(a, b) for a, b in zip(small, big))
    return small == big and type(small) is type(big)


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 4, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_yaml_model_yaml_round_trip(path: Path) -> None:
    source = yaml.safe_load(path.read_text())
    job = load_job(path)
    manifest = job.to_manifest()
    # Everything the author wrote comes back, camelCase, and defaults are filled in.
    assert _subset(source, manifest)
    assert manifest["spec"]["output"]["builder"] in {"prefix-merge", "per-request"}
    assert "api_version" not in manifest and manifest["apiVersion"] == "tracefleet.io/v1alpha1"
    # No nulls on the wire: the apiserver would prune them, and `has()` in CEL must mean "written".
    assert "null" not in job_to_yaml(job)
    again = job_from_yaml(job_to_yaml(job))
    assert again == job
    assert again.to_manifest() == manifest
    # exclude_defaults gives a minimal manifest that still parses to the same job.
    assert RolloutJob.from_manifest(job.to_manifest(exclude_defaults=True)) == job


def test_snake_case_attributes_and_camel_case_wire() -> None:
    job = load_job(REPO / "examples" / "k8s" / "managed-vllm-codex.yaml")
    managed = job.spec.inference.managed
    assert managed is not None and job.spec.inference.is_managed
    assert managed.image == DEFAULT_VLLM_IMAGE
    assert managed.tensor_parallel_size == 1 and managed.gpus() == 1
    assert managed.served_name() == "Qwen/Qwen3-4B"
    assert managed.model_cache is not None and managed.model_cache.claim_name == "model-cache"
    assert job.spec.harness.runtime_class_name == "gvisor"
    assert job.spec.tasks.samples_per_task == 8
    assert job.session_count() == 16
    assert job.spec.trainer is not None and job.spec.trainer.webhook is not None
    assert job.spec.trainer.webhook.secret_ref is not None and job.spec.trainer.webhook.secret_ref.key == "hmac-key"
    assert job.name == "codex-qwen3-bugfix" and job.namespace is None
    # Python names are accepted too (populate_by_name), so code can build jobs directly.
    spec = job.spec.model_copy(update={"parallelism": 3})
    assert spec.model_dump(by_alias=True)["parallelism"] == 3
    assert "tensorParallelSize" in job.to_manifest()["spec"]["inference"]["managed"]


def test_defaults_are_filled() -> None:
    job = load_job(REPO / "examples" / "local-command.yaml")
    spec = job.spec
    assert spec.inference.capture.mode == "auto"
    assert spec.inference.policy_version == 0
    assert spec.harness.workspace.workdir == "/workspace"
    assert spec.output.builder == "prefix-merge"
    assert spec.parallelism == 1 and spec.max_retries == 2 and spec.suspend is False
    assert spec.evaluator is not None and spec.evaluator.timeout_seconds == 600
    assert job.status is None


def test_session_count_needs_task_count_for_external_tasks() -> None:
    job = load_job(REPO / "examples" / "k8s" / "external-engine-claude.yaml")
    with pytest.raises(ValueError, match="task_count"):
        job.session_count()
    assert job.session_count(task_count=25) == 100


def test_status_round_trip() -> None:
    data = yaml.safe_load((REPO / "examples" / "local-command.yaml").read_text())
    data["status"] = {
        "phase": "Running",
        "observedGeneration": 2,
        "startTime": "2026-01-02T03:04:05Z",
        "conditions": [
            {"type": "InferenceReady", "status": "True", "reason": "Available", "message": "1/1 replicas",
             "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 2},
        ],
        "counters": {"total": 10, "running": 2, "succeeded": 7, "failed": 1, "traces": 9, "tokens": 12345},
        "recentBatches": [{"seq": 0, "uri": "./batches/local-command/batches/000000", "traces": 8, "meanReward": 0.5,
                           "sealedAt": "2026-01-02T03:10:00Z"}],
        "batchesCompleted": 1,
    }
    job = RolloutJob.from_manifest(data)
    assert job.status is not None
    assert job.status.counters.succeeded == 7 and job.status.counters.pending == 0
    cond = job.status.condition("InferenceReady")
    assert cond is not None and cond.status == "True" and cond.last_transition_time is not None
    assert job.status.recent_batches is not None and job.status.recent_batches[0].mean_reward == 0.5
    out = job.to_manifest()["status"]
    assert out["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert out["recentBatches"][0]["sealedAt"] == "2026-01-02T03:10:00Z"
    assert RolloutJob.from_manifest(job.to_manifest()) == job


def test_scalars_are_strict_like_the_apiserver() -> None:
    base = yaml.safe_load((REPO / "examples" / "local-command.yaml").read_text())
    for path, value in [(("parallelism",), "2"), (("suspend",), "true"), (("harness", "sessionTimeoutSeconds"), 1.5)]:
        data = copy.deepcopy(base)
        node = data["spec"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        problems = validate_manifest(data)
        assert [p.path for p in problems] == ["spec." + ".".join(path)], problems
        with pytest.raises(ValidationError):
            RolloutJob.from_manifest(data)


def test_from_yaml_refuses_several_documents() -> None:
    text = (REPO / "examples" / "local-command.yaml").read_text()
    with pytest.raises(ValueError, match="one YAML document"):
        job_from_yaml(text + "\n---\n" + text)


def test_managed_by_is_immutable_locally() -> None:
    old = load_job(REPO / "examples" / "k8s" / "bucket-tasks-kueue.yaml")
    same = old.model_copy(deep=True)
    same.spec.parallelism = 1
    assert validate_update(old, same) == []
    changed = old.model_copy(deep=True)
    changed.spec.managed_by = "tracefleet.io/operator"
    assert [str(p) for p in validate_update(old, changed)] == ["spec.managedBy: managedBy is immutable"]
    cleared = old.model_copy(deep=True)
    cleared.spec.managed_by = None
    assert [p.path for p in validate_update(old, cleared)] == ["spec.managedBy"]
