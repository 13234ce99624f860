"""A task as the runner sees it (the model is on the contract floor: tracefleet.contract.session.Task),
and how a RolloutJob's task (an inline or JSONL entry, or a Harbor task folder) becomes one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracefleet.contract.harbor import HarborTaskRun
from tracefleet.contract.session import Task, is_remote

__all__ = ["Task", "is_remote", "task_from_api", "harbor_tasks", "with_image"]


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


def harbor_tasks(root: Path, label: str, include: list[str] | None = None) -> list[Task]:
    """The Harbor task folders under `root` (tracefleet.harbor.folders.task_folders; `label` names the source in
    messages) as runner tasks: the prompt is instruction.md, the id the folder's name, [metadata] the task's
    metadata. A folder with problems is still a task, refused with its problems in one line, so that its sessions
    are fail-closed rows and the job goes on with the others. Images are attached later (`with_image`)."""
    from tracefleet.harbor.folders import check_task, task_folders

    tasks = []
    for folder in task_folders(root, include):
        checked, problems = check_task(folder, label if folder == root else f"{label.rstrip('/')}/{folder.name}")
        refusal = "; ".join(map(str, problems)) or None
        tasks.append(Task(
            id=folder.name,
            prompt=checked.instruction if checked is not None else "",
            metadata=dict(checked.config.metadata) if checked is not None else {},
            harbor=HarborTaskRun(folder=str(folder.resolve()), refusal=refusal,
                                 workdir=checked.config.environment.workdir if checked is not None else None,
                                 agent_timeout_s=checked.config.agent.timeout_sec if checked is not None else None),
        ))
    return tasks


def with_image(task: Task, *, image: str | None = None, workdir: str | None = None, refusal: str | None = None) -> Task:
    """The Harbor task with its image found (and the working directory in it), or refused in one line."""
    assert task.harbor is not None
    update = {k: v for k, v in {"image": image, "refusal": refusal}.items() if v is not None}
    if workdir is not None and task.harbor.workdir is None:
        update["workdir"] = workdir
    return task.model_copy(update={"harbor": task.harbor.model_copy(update=update)})
