"""The planner: every session of a RolloutJob, planned once (design §2.10), by this one function in either driver.

    read_tasks     a tasks file (JSON lines, spec.tasks.uri or a ConfigMap's key) as typed TaskSpecs: every reader
    task_specs     the job's RolloutJob tasks: inline, or its tasks file's (each driver fetches the file its way)
    task_from_api  a RolloutJob task (inline or a tasks-file line) as the session's Task
    harbor_task    a checked Harbor task folder as the session's Task
    plan_sessions  the job's SessionPlans: tasks × samples, the harness, the evaluator, the limits
    plan_proxy     the job's ProxyPlan: capture mode, tokenizer, engine limits, logprobs kind, sampling

`tracefleet run` plans with the job file's folder as `job_dir`; the operator plans without one and ships each plan
whole to the pods of its session (files: tracefleet.contract.plan_files), where the pod program settles it at its own
job folder (`SessionPlan.at`, the same rule). Defaults: one per quantity, on this floor
(tracefleet.contract.semantics.SESSION_TIMEOUT_S, EVALUATOR_TIMEOUT_S), which the RolloutJob's fields default to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from tracefleet.contract.engine_limits import LOGPROBS_MODES
from tracefleet.contract.harbor import HarborTaskRun, TaskConfig
from tracefleet.contract.job import TaskSpec
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.semantics import evaluator_type, session_slots
from tracefleet.contract.session import EvaluatorSpec, HarnessConfig, SessionPlan, Task, session_id

if TYPE_CHECKING:
    from tracefleet.contract.job import RolloutJob


class TasksFileError(ValueError):
    """A tasks file that does not read: one line naming the file and the line."""


def read_tasks(text: str, where: str) -> list[TaskSpec]:
    """The tasks of a JSON-lines tasks file (`where` names it in errors), as the RolloutJob's TaskSpec."""
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(TaskSpec.model_validate_json(line, by_name=False))
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            at = ".".join(map(str, err["loc"]))
            raise TasksFileError(f"{where}: line {number}: {at + ': ' if at else ''}{err['msg']}") from None
    return tasks


def task_specs(job: RolloutJob, text: str | None) -> list[TaskSpec]:
    """The job's tasks as the RolloutJob states them: inline, or the JSON lines `text` of its tasks file (the
    ConfigMap's key, spec.tasks.uri's object), which the driver fetched. Harbor folders are read elsewhere
    (tracefleet.harbor)."""
    tasks = job.spec.tasks
    if tasks.inline is not None:
        return list(tasks.inline)
    cm = tasks.config_map_ref
    return read_tasks(text or "", f"ConfigMap {cm.name} key {cm.key}" if cm is not None else f"spec.tasks.uri {tasks.uri}")


def task_from_api(api_task: TaskSpec, extra_setup: Sequence[str] = ()) -> Task:
    """The session's task from a RolloutJob task; spec.harness.workspace.setup runs after the task's own setup.
    Relative paths stay relative until the plan is settled at a job folder (SessionPlan.at)."""
    ws = api_task.workspace
    metadata = dict(api_task.metadata or {})
    return Task(
        id=api_task.id,
        prompt=api_task.prompt,
        repo=ws.repo if ws else None,
        ref=ws.ref if ws else None,
        archive=ws.archive if ws else None,
        setup=[*((ws.setup or []) if ws else []), *extra_setup],
        FAIL_TO_PASS=list(api_task.fail_to_pass or []),
        PASS_TO_PASS=list(api_task.pass_to_pass or []),
        test_command=list(api_task.test_command) if api_task.test_command else None,
        protected=list(metadata.get("protected", [])),  # files restored from the original before tests run
        metadata=metadata,
    )


def harbor_task(name: str, instruction: str, config: TaskConfig | None, folder: str, refusal: str | None = None) -> Task:
    """The session's task from a Harbor task folder: the prompt is instruction.md, the id the folder's name, task.toml's
    [metadata] the task's metadata (`config` None: a folder that did not read, refused). `folder` is where its tests
    are read again: a folder here, or the task source's URI on a cluster."""
    return Task(
        id=name,
        prompt=instruction,
        metadata=dict(config.metadata) if config is not None else {},
        harbor=HarborTaskRun(folder=folder, refusal=refusal,
                             workdir=config.environment.workdir if config is not None else None,
                             agent_timeout_s=config.agent.timeout_sec if config is not None else None,
                             verifier_timeout_s=config.verifier.timeout_sec if config is not None else None),
    )


def job_tasks_of(job: RolloutJob, api_tasks: Sequence[TaskSpec]) -> list[Task]:
    """The job's inline or tasks-file tasks as sessions' tasks (spec.harness.workspace.setup added)."""
    extra = list(job.spec.harness.workspace.setup or [])
    return [task_from_api(t, extra) for t in api_tasks]


def evaluator_spec(job: RolloutJob) -> EvaluatorSpec:
    """How the job's sessions are judged. Harbor tasks bring their own judge (tests/test.sh): a job of them is judged
    by it unless it says otherwise; a job without an evaluator is not judged."""
    ev = job.spec.evaluator
    if ev is None:
        return EvaluatorSpec(type="harbor") if job.spec.tasks.harbor else EvaluatorSpec(type="none")
    return EvaluatorSpec(
        type=evaluator_type(ev.preset),  # type: ignore[arg-type]
        command=list(ev.command) if ev.command else None,
        entrypoint=ev.entry_point,
        timeout_s=float(ev.timeout_seconds),
    )


def harness_config(job: RolloutJob, task: Task | None = None) -> HarnessConfig:
    """The harness of the job's sessions of `task` (None: of any task, as the job states it): its time limit is the
    job's, or a Harbor task's [agent].timeout_sec when that is shorter (the one place this rule is written)."""
    h = job.spec.harness
    timeout_s = float(h.session_timeout_seconds)
    agent = task.harbor.agent_timeout_s if task is not None and task.harbor is not None else None
    return HarnessConfig(preset=h.preset, command=list(h.command) if h.command else None, env=dict(h.env or {}),
                         timeout_s=min(timeout_s, agent) if agent else timeout_s, workdir=h.workspace.workdir)


def plan_sessions(job: RolloutJob, tasks: Sequence[Task], model: str | None, *,
                  job_dir: Path | None = None) -> list[SessionPlan]:
    """Every session of the job, in index order: task × sample, its group, the harness, the evaluator, the model the
    harness asks for (None: `default`) and the job's limits. With `job_dir` the plans are settled there
    (SessionPlan.at); without, a pod settles its own."""
    spec = job.spec
    ev = evaluator_spec(job)
    by_id = {t.id: t for t in tasks}
    plans = [
        SessionPlan(
            index=p.index,
            session_id=session_id(job.name, p.index),
            job=job.name,
            task=by_id[p.task_id],
            sample_index=p.sample_index,
            group_id=p.group_id,
            harness=harness_config(job, by_id[p.task_id]),
            evaluator=ev,
            model=model or "default",
            builder=spec.output.builder,
            diagnostics=spec.diagnostics,
            policy_version=spec.inference.policy_version,
        )
        for p in session_slots(job.name, [t.id for t in tasks], spec.tasks.samples_per_task)
    ]
    return plans if job_dir is None else [p.at(job_dir) for p in plans]


def plan_proxy(job: RolloutJob, model: str | None, engine_url: str) -> ProxyPlan:
    """The job's proxy: its engine at `engine_url` (the driver knows where: the job's external URL, or the managed
    engine's address), the model harnesses ask for (None: the first the engine lists) and what spec.inference says.
    Exact mode reads the tokenizer of the model a managed engine loads, else of the served model (or the engine's
    own `root`: tracefleet.proxy.mode)."""
    inference = job.spec.inference
    capture = inference.capture
    stated = inference.logprobs_mode()
    return ProxyPlan(
        engine_url=engine_url.rstrip("/"),
        mode=capture.mode,
        served_model=model,
        tokenizer=capture.tokenizer or (inference.managed.model if inference.managed is not None else None),
        model_family=capture.model_family,
        tool_parser=capture.tool_parser,
        engine_limits=inference.engine_timeouts.limits(),
        logprobs_mode=stated if stated in LOGPROBS_MODES else None,  # type: ignore[arg-type]  # checked: one of them
        sampling=inference.sampling.override(),
        policy_version=inference.policy_version,
    )
