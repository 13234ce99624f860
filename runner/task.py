"""A task as the runner sees it (the model is on the contract floor: tracefleet.contract.session.Task),
and how a RolloutJob's task becomes one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracefleet.contract.session import Task, is_remote

__all__ = ["Task", "is_remote", "task_from_api"]


def task_from_api(api_task: Any, base_dir: Path, extra_setup: list[str] | None = None) -> Task:
    """The runner's task from a RolloutJob task (`tracefleet.api` model). Paths are relative to
    base_dir; `metadata.protected` lists files restored from the original before tests run."""
    ws = api_task.workspace
    metadata = dict(api_task.metadata or {})
    task = Task(
        id=api_task.id,
        prompt=api_task.prompt,
        repo=ws.repo if ws else None,
        ref=ws.ref if ws else None,
        archive=ws.archive if ws else None,
        setup=[*((ws.setup or []) if ws else []), *(extra_setup or [])],
        FAIL_TO_PASS=list(api_task.fail_to_pass or []),
        PASS_TO_PASS=list(api_task.pass_to_pass or []),
        test_command=list(api_task.test_command) if api_task.test_command else None,
        protected=list(metadata.get("protected", [])),
        metadata=metadata,
    )
    return task.resolved(base_dir)
