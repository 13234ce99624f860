"""The jobs the trainer runs, made from the user's: a job's tasks, the same job over other tasks, the model it trains.
The loop (trainer.loop) and the warm start's demonstrations (trainer.demos) both shape jobs with these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracefleet.contract.job import RolloutJob, Tasks, TaskSpec
from tracefleet.contract.plan import task_specs
from tracefleet.usage import UsageError

TRAIN_MODELS = ("smollm2",)  # shipped models the trainer can load from vLLM's converted directory


def job_tasks(job: RolloutJob, base_dir: Path) -> list[TaskSpec]:
    """The job's tasks (TaskSpec), inline or from a local spec.tasks.uri file (relative to `base_dir`)."""
    spec = job.spec
    if spec.tasks.inline:
        return task_specs(job, None)
    if spec.tasks.uri and "://" not in spec.tasks.uri:
        path = Path(spec.tasks.uri)
        return task_specs(job, (path if path.is_absolute() else base_dir / path).read_text())
    raise UsageError("tracefleet train reads the job's tasks: give them as spec.tasks.inline or a local "
                     "spec.tasks.uri file")


def with_tasks(job: RolloutJob, tasks: list[TaskSpec], samples_per_task: int, traces_per_batch: int,
               name: str | None = None) -> RolloutJob:
    """`job` running `tasks` inline, `samples_per_task` each, sealed `traces_per_batch` per batch (renamed `name`)."""
    spec = job.spec
    output = spec.output.model_copy(update={"traces_per_batch": traces_per_batch})
    new_spec = spec.model_copy(update={"tasks": Tasks(inline=tasks, samples_per_task=samples_per_task), "output": output})
    update: dict[str, Any] = {"spec": new_spec}
    if name is not None:
        update["metadata"] = job.metadata.model_copy(update={"name": name})
    return job.model_copy(update=update)


def trained_model(job: RolloutJob) -> str:
    """The shipped model the job's managed engine serves, which the trainer loads; a UsageError for any other."""
    from tracefleet.runner.local import LOCAL_MODEL_ALIASES

    managed = job.spec.inference.managed
    name = LOCAL_MODEL_ALIASES.get(managed.model) if managed is not None else None
    if name not in TRAIN_MODELS:
        model = managed.model if managed is not None else "an external engine"
        raise UsageError(f"tracefleet train trains a shipped model on this machine ({', '.join(TRAIN_MODELS)}); "
                         f"the job serves {model!r}")
    return name
