"""What pods are given from outside: environment lists, bucket credentials and the session's task.

The variables themselves are the typed pod environment (tracefleet.contract.podenv); this module turns them
into a container's `env` and gives the task its volumes."""

from __future__ import annotations

from typing import Any

from tracefleet.contract.job import RolloutJob

TASKS_VOLUME = "tasks"
TASKS_DIR = "/tasks"


def env_vars(items: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in items.items()]


def env_ref(name: str) -> str:
    """`$(NAME)`: the kubelet expands it in a container's args from the container's env, so a secret
    value stays out of the args."""
    return f"$({name})"


def bucket_env_from(job: RolloutJob) -> list[dict[str, Any]]:
    if (ref := job.spec.output.credentials_secret_ref) is None:
        return []
    return [{"secretRef": {"name": ref.name}}]


def task_source(job: RolloutJob, task: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(task fields of tracefleet.contract.podenv.SessionEnv, volumes, mounts) that give a pod its task; the
    harness pod and the evaluator Job read it the same way, and neither needs API access for it."""
    tasks = job.spec.tasks
    if tasks.inline is not None:
        # Inline tasks travel in the pod itself.
        return {"task_json": tasks.inline[task].model_dump(mode="json", by_alias=True, exclude_none=True)}, [], []
    if (cm := tasks.config_map_ref) is not None:
        return (
            {"tasks_file": f"{TASKS_DIR}/{cm.key}"},
            [{"name": TASKS_VOLUME, "configMap": {"name": cm.name}}],
            [{"name": TASKS_VOLUME, "mountPath": TASKS_DIR, "readOnly": True}],
        )
    if tasks.uri:
        return {"tasks_uri": tasks.uri}, [], []
    return {}, [], []
