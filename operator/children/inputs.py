"""What pods are given from outside: environment lists, bucket credentials and the session's task.

The variables themselves are the typed pod environment (tracefleet.contract.podenv); this module turns them
into a container's `env` and gives the task its volumes."""

from __future__ import annotations

from typing import Any

from ..view import JobView


def env_vars(items: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in items.items()]


def env_ref(name: str) -> str:
    """`$(NAME)`: the kubelet expands it in a container's args from the container's env, so a secret
    value stays out of the args."""
    return f"$({name})"


def bucket_env_from(job: JobView) -> list[dict[str, Any]]:
    if not job.credentials_secret:
        return []
    return [{"secretRef": {"name": job.credentials_secret}}]


def task_source(job: JobView, task: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(task fields of tracefleet.contract.podenv.SessionEnv, volumes, mounts) that give a pod its task; the
    harness pod and the evaluator Job read it the same way, and neither needs API access for it."""
    if job.tasks_inline is not None:
        # Inline tasks travel in the pod itself.
        return {"task_json": job.tasks_inline[task]}, [], []
    if job.tasks_configmap:
        return (
            {"tasks_file": f"/tasks/{job.tasks_configmap[1]}"},
            [{"name": "tasks", "configMap": {"name": job.tasks_configmap[0]}}],
            [{"name": "tasks", "mountPath": "/tasks", "readOnly": True}],
        )
    if job.tasks_uri:
        return {"tasks_uri": job.tasks_uri}, [], []
    return {}, [], []
