"""A task as the runner sees it (the model is on the contract floor: tracefleet.contract.session.Task, and a
RolloutJob's task becomes one by tracefleet.contract.plan), and the Harbor task folders of this machine."""

from __future__ import annotations

from pathlib import Path

from tracefleet.contract.plan import harbor_task
from tracefleet.contract.session import Task, is_remote

__all__ = ["Task", "is_remote", "harbor_tasks", "with_image"]


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
        tasks.append(harbor_task(folder.name, checked.instruction if checked is not None else "",
                                 checked.config if checked is not None else None, str(folder.resolve()), refusal))
    return tasks


def with_image(task: Task, *, image: str | None = None, workdir: str | None = None, refusal: str | None = None) -> Task:
    """The Harbor task with its image found (and the working directory in it), or refused in one line."""
    assert task.harbor is not None
    update = {k: v for k, v in {"image": image, "refusal": refusal}.items() if v is not None}
    if workdir is not None and task.harbor.workdir is None:
        update["workdir"] = workdir
    return task.model_copy(update={"harbor": task.harbor.model_copy(update=update)})
