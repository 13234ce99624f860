"""A job's sessions planned on the cluster: its tasks as the operator reads them (inline, a ConfigMap's or a bucket
object's JSON lines, Harbor task folders), planned by the contract's one planner
(tracefleet.contract.plan.plan_sessions, the function `tracefleet run` plans with) without a job folder: each pod
settles its plan at its own (SessionPlan.at). The builders ship each plan whole, as files (children.plan_volume)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracefleet.contract.job import RolloutJob
from tracefleet.contract.plan import job_tasks_of, plan_proxy, plan_sessions, task_specs
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.session import SessionPlan, Task
from tracefleet.operator.children.inference import inference_service_url

if TYPE_CHECKING:
    from tracefleet.operator.harbor_tasks import HarborSource


def job_tasks(job: RolloutJob, text: str | None = None, harbor: HarborSource | None = None) -> list[Task]:
    """The job's tasks: inline, the JSON lines `text` of its ConfigMap or URI, or its Harbor source's tasks."""
    if harbor is not None:
        assert job.spec.tasks.harbor is not None
        return [t.task(job.spec.tasks.harbor.uri) for t in harbor.tasks]
    return job_tasks_of(job, task_specs(job, text))


def job_plans(job: RolloutJob, tasks: list[Task]) -> list[SessionPlan]:
    """Every session's plan, by session index; the model is the one the engine serves (`default` when unnamed)."""
    return plan_sessions(job, tasks, job.spec.inference.served_model())


def proxy_plan(job: RolloutJob) -> ProxyPlan:
    """The job's proxy, planned by the contract's one planner (tracefleet.contract.plan.plan_proxy, as `tracefleet run`
    plans it): its engine the job's Service (managed) or external URL, the model the engine serves by name."""
    return plan_proxy(job, job.spec.inference.served_model(), inference_service_url(job))


def for_sealer(plan: SessionPlan) -> SessionPlan:
    """What a sealer Job is given of a session's plan: all of it but the task's content (its rows carry the task's id
    and metadata; the prompt, files and tests are the harness's and the evaluator's), which keeps the sealer's one
    variable small for a batch of many sessions."""
    task = Task(id=plan.task.id, prompt="", metadata=plan.task.metadata)
    return plan.model_copy(update={"task": task})
