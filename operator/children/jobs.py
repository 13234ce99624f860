"""Evaluator and sealer Jobs: batch pods that score one session or seal one batch."""

from __future__ import annotations

from typing import Any

from tracefleet.contract.job import RolloutJob
from tracefleet.contract.session import SessionPlan
from tracefleet.operator import names as n
from tracefleet.operator.children.inputs import bucket_env_from, env_vars
from tracefleet.operator.children.metadata import Manifest, child_labels, metadata, pod_fields
from tracefleet.operator.children.network_policy import evaluator_network_labels, network_labels
from tracefleet.operator.children.security import container_security_context, pod_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.contract.podenv import EVALUATOR_FATAL_EXIT_CODE, EvaluatorEnv, SealerEnv
from tracefleet.operator.children.task_image import verifier_steps
from tracefleet.operator.harbor_tasks import ClusterHarborTask
from tracefleet.operator.plans import sealing_plan


EVALUATOR_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
HARBOR_STEPS_S = 300


def _batch_pod_spec(job: RolloutJob, cfg: OperatorConfig, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "containers": [{**container, "securityContext": container_security_context()}],
        **pod_fields(job, cfg.image_pull_secrets),
    }


def evaluator_job(job: RolloutJob, cfg: OperatorConfig, plan: SessionPlan, harbor: ClusterHarborTask | None = None) -> Manifest:
    """Scores one finished session in a fresh pod: reads `sessions/<s>/` and writes `reward.json`. The session's `plan`
    goes whole: the evaluator judges against the task the operator planned, never one the harness could rewrite. A
    Harbor task (`harbor`) is judged by its own tests/test.sh in a fresh container of its image (children.task_image)."""
    e = job.spec.evaluator
    assert e is not None or harbor is not None, "a job without an evaluator has no evaluator Jobs"
    session = plan.index
    task, sample = n.task_sample_of(session, job.spec.tasks.samples_per_task)
    labels = {n.LABEL_SESSION: str(session), n.LABEL_TASK: str(task), n.LABEL_SAMPLE: str(sample)}
    env = EvaluatorEnv(bucket=job.spec.output.uri, endpoint=cfg.bucket_endpoint, plan=plan)
    if harbor is not None:
        return _harbor_evaluator_job(job, cfg, session, harbor, {**labels, **network_labels(harbor, "verifier")}, env)
    assert e is not None
    labels.update(evaluator_network_labels(job))
    container = {
        "name": "evaluator",
        "image": job.spec.evaluator_image() or cfg.evaluator_image,
        "command": ["python", "-m", n.POD_PROGRAMS, "evaluate"],
        "env": env_vars(env.to_env()),
        "envFrom": bucket_env_from(job),
        "resources": EVALUATOR_RESOURCES,
    }
    return _evaluator_manifest(job, session, labels, _batch_pod_spec(job, cfg, container), e.timeout_seconds)


def _harbor_evaluator_job(job: RolloutJob, cfg: OperatorConfig, session: int, harbor: ClusterHarborTask,
                          labels: dict[str, str], env: EvaluatorEnv) -> Manifest:
    h = job.spec.harness
    fallback = h.resources.model_dump(mode="json", exclude_none=True) if h.resources else EVALUATOR_RESOURCES
    init, report, volumes = verifier_steps(cfg, harbor, env.to_env(), bucket_env_from(job), fallback)
    pod_spec = _batch_pod_spec(job, cfg, report)
    pod_spec["initContainers"] = init
    pod_spec["volumes"] = volumes
    if h.runtime_class_name:  # the agent's changes run again here
        pod_spec["runtimeClassName"] = h.runtime_class_name
    # the fetch and report steps' time on top of test.sh's
    return _evaluator_manifest(job, session, labels, pod_spec, harbor.verifier_timeout_s + HARBOR_STEPS_S)


def _evaluator_manifest(job: RolloutJob, session: int, labels: dict[str, str], pod_spec: dict[str, Any],
                        deadline_s: int) -> Manifest:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, n.evaluator_job_name(job.name, session), n.COMPONENT_EVALUATOR, **labels),
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": deadline_s,
            # Evictions and preemptions are not the evaluator's fault; a known-bad exit code is final.
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "evaluator", "operator": "In", "values": [EVALUATOR_FATAL_EXIT_CODE]},
                    },
                ]
            },
            "template": {
                "metadata": {"labels": child_labels(job, n.COMPONENT_EVALUATOR, **labels)},
                "spec": pod_spec,
            },
        },
    }


def sealer_job(job: RolloutJob, cfg: OperatorConfig, seq: int, plans: list[SessionPlan]) -> Manifest:
    """Builds and seals batch `seq` from exactly the sessions of `plans` (whole groups, fixed at creation: Jobs
    are immutable, so a restarted operator sees the same assignment and never seals a session twice). The
    Job is given the sessions' plans (tracefleet.operator.plans.sealing_plan): it seals failed sessions too,
    whose pods may have left nothing that says which task they ran."""
    indices = [p.index for p in plans]
    ranges = n.encode_ranges(indices)
    spec = job.spec
    env = SealerEnv(bucket=spec.output.uri, endpoint=cfg.bucket_endpoint, job=job.name, batch_seq=seq, sessions=indices,
                    plans=[sealing_plan(p) for p in plans])
    container = {
        "name": "sealer",
        "image": cfg.proxy_image,
        "command": ["python", "-m", n.POD_PROGRAMS, "seal"],
        "env": env_vars(env.to_env()),
        "envFrom": bucket_env_from(job),
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
    }
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, n.sealer_job_name(job.name, seq), n.COMPONENT_SEALER, **{n.LABEL_BATCH: str(seq)}),
        "spec": {
            "backoffLimit": 4,
            "activeDeadlineSeconds": 3600,
            "template": {
                "metadata": {"labels": child_labels(job, n.COMPONENT_SEALER, **{n.LABEL_BATCH: str(seq)})},
                "spec": _batch_pod_spec(job, cfg, container),
            },
        },
    }
    manifest["metadata"]["annotations"] = {n.ANNOTATION_SESSIONS: ranges}
    return manifest
