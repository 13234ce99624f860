"""What pods are given from outside: environment lists, bucket access and the session's task."""

from __future__ import annotations

from typing import Any

from ..view import JobView


def env_vars(items: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in items.items()]


def bucket_env(job: JobView) -> list[dict[str, Any]]:
    env = env_vars({"TRACEFLEET_BUCKET": job.bucket_uri})
    if job.bucket_endpoint:
        env += env_vars({"AWS_ENDPOINT_URL": job.bucket_endpoint})
    return env


def bucket_env_from(job: JobView) -> list[dict[str, Any]]:
    if not job.credentials_secret:
        return []
    return [{"secretRef": {"name": job.credentials_secret}}]


def task_source(job: JobView, task: int) -> tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, volumes, mounts) that give a pod its task; the harness pod and the evaluator Job read it
    the same way (tracefleet.runner.pod.task_from_env), and neither needs API access for it."""
    if job.tasks_inline is not None:
        # Inline tasks travel in the pod itself.
        import json

        return {"TRACEFLEET_TASK_JSON": json.dumps(job.tasks_inline[task], sort_keys=True)}, [], []
    if job.tasks_configmap:
        return (
            {"TRACEFLEET_TASKS_FILE": f"/tasks/{job.tasks_configmap[1]}"},
            [{"name": "tasks", "configMap": {"name": job.tasks_configmap[0]}}],
            [{"name": "tasks", "mountPath": "/tasks", "readOnly": True}],
        )
    if job.tasks_uri:
        return {"TRACEFLEET_TASKS_URI": job.tasks_uri}, [], []
    return {}, [], []
