"""Evaluator and sealer Jobs: batch pods that score one session or seal one batch."""

from __future__ import annotations

import math

from kubernetes.client import (V1Container, V1Job, V1JobSpec, V1ObjectMeta, V1PodFailurePolicy,
                               V1PodFailurePolicyOnExitCodesRequirement, V1PodFailurePolicyOnPodConditionsPattern,
                               V1PodFailurePolicyRule, V1PodSpec, V1PodTemplateSpec, V1ResourceRequirements)

from tracefleet.contract.job import RolloutJob
from tracefleet.contract.session import SessionPlan
from tracefleet.operator import names as n
from tracefleet.operator.children.inputs import bucket_env_from, job_resources
from tracefleet.operator.children.metadata import Manifest, as_manifest, child_labels, job_pod_spec, object_meta
from tracefleet.operator.children.network_policy import evaluator_network_labels, network_labels
from tracefleet.operator.children.plan_volume import Child, plan_config_maps, plan_mount, plan_volume
from tracefleet.contract.plan_files import PLAN_FOLDER, SESSION_PLAN, SESSION_PLANS
from tracefleet.operator.children.security import container_security_context, pod_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.contract.podenv import EVALUATOR_FATAL_EXIT_CODE, EvaluatorEnv, SealerEnv
from tracefleet.operator.children.task_image import pod_program, verifier_steps
from tracefleet.operator.harbor_tasks import ClusterHarborTask
from tracefleet.operator.plans import for_sealer


EVALUATOR_RESOURCES = V1ResourceRequirements(requests={"cpu": "250m", "memory": "512Mi"}, limits={"memory": "2Gi"})
SEALER_RESOURCES = V1ResourceRequirements(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "4Gi"})
HARBOR_STEPS_S = 300
SEALER_DEADLINE_S = 3600
# Evictions and preemptions are not the evaluator's fault; a known-bad exit code is final.
EVALUATOR_FAILURE_POLICY = V1PodFailurePolicy(rules=[
    V1PodFailurePolicyRule(action="Ignore", on_pod_conditions=[V1PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget")]),
    V1PodFailurePolicyRule(action="FailJob", on_exit_codes=V1PodFailurePolicyOnExitCodesRequirement(
        container_name="evaluator", operator="In", values=[EVALUATOR_FATAL_EXIT_CODE])),
])


def _batch_pod_spec(job: RolloutJob, cfg: OperatorConfig, container: V1Container, config_maps: list[Manifest],
                    document: str) -> V1PodSpec:
    """A Job's pod: `container` and its plan, `document` of `config_maps` (children.plan_volume)."""
    container.security_context = container_security_context()
    container.volume_mounts = [*(container.volume_mounts or []), plan_mount()]
    return job_pod_spec(job, cfg.image_pull_secrets, V1PodSpec(
        restart_policy="Never", security_context=pod_security_context(), containers=[container],
        volumes=[plan_volume(config_maps, document)]))


def _batch_job(meta: V1ObjectMeta, template_labels: dict[str, str], pod_spec: V1PodSpec, *, backoff_limit: int,
               deadline_s: int, failure_policy: V1PodFailurePolicy | None = None) -> Manifest:
    return as_manifest(V1Job(api_version="batch/v1", kind="Job", metadata=meta, spec=V1JobSpec(
        backoff_limit=backoff_limit, active_deadline_seconds=deadline_s, pod_failure_policy=failure_policy,
        template=V1PodTemplateSpec(metadata=V1ObjectMeta(labels=template_labels), spec=pod_spec))))


def evaluator_job(job: RolloutJob, cfg: OperatorConfig, plan: SessionPlan, harbor: ClusterHarborTask | None = None) -> Child:
    """Scores one finished session in a fresh pod: reads `sessions/<s>/` and writes `reward.json`. The session's `plan`
    goes whole: the evaluator judges against the task the operator planned, never one the harness could rewrite. A
    Harbor task (`harbor`) is judged by its own tests/test.sh in a fresh container of its image (children.task_image)."""
    e = job.spec.evaluator
    assert e is not None or harbor is not None, "a job without an evaluator has no evaluator Jobs"
    session = plan.index
    task, sample = n.task_sample_of(session, job.spec.tasks.samples_per_task)
    labels = {n.LABEL_SESSION: str(session), n.LABEL_TASK: str(task), n.LABEL_SAMPLE: str(sample)}
    env = EvaluatorEnv(bucket=job.spec.output.uri, endpoint=cfg.bucket_endpoint, plan=plan, plan_dir=PLAN_FOLDER)
    config_maps = plan_config_maps(job, n.evaluator_job_name(job.name, session), n.COMPONENT_EVALUATOR, env)
    if harbor is not None:
        labels.update(network_labels(harbor, "verifier"))
        pod_spec, deadline_s = _harbor_evaluator_pod(job, cfg, harbor, env, config_maps)
    else:
        labels.update(evaluator_network_labels(job))
        container = pod_program("evaluator", job.spec.evaluator_image() or cfg.evaluator_image, ["evaluate"],
                                env.to_env(), bucket_env_from(job), EVALUATOR_RESOURCES)
        pod_spec = _batch_pod_spec(job, cfg, container, config_maps, SESSION_PLAN)
        deadline_s = math.ceil(plan.evaluator.timeout_s)
    name = n.evaluator_job_name(job.name, session)
    return Child(_batch_job(object_meta(job, name, n.COMPONENT_EVALUATOR, **labels),
                            child_labels(job, n.COMPONENT_EVALUATOR, **labels), pod_spec, backoff_limit=2,
                            deadline_s=deadline_s, failure_policy=EVALUATOR_FAILURE_POLICY), config_maps)


def _harbor_evaluator_pod(job: RolloutJob, cfg: OperatorConfig, harbor: ClusterHarborTask, env: EvaluatorEnv,
                          config_maps: list[Manifest]) -> tuple[V1PodSpec, int]:
    """The pod of a Harbor task's evaluator Job (fetch, verify, report) and the Job's deadline."""
    h = job.spec.harness
    fallback = job_resources(h.resources) or EVALUATOR_RESOURCES
    init, report, volumes = verifier_steps(cfg, harbor, env.to_env(), bucket_env_from(job), fallback)
    pod_spec = _batch_pod_spec(job, cfg, report, config_maps, SESSION_PLAN)
    pod_spec.init_containers = init
    pod_spec.volumes = [*(pod_spec.volumes or []), *volumes]
    pod_spec.runtime_class_name = h.runtime_class_name or None  # the agent's changes run again here
    # the fetch and report steps' time on top of test.sh's
    return pod_spec, harbor.verifier_timeout_s + HARBOR_STEPS_S


def sealer_job(job: RolloutJob, cfg: OperatorConfig, seq: int, plans: list[SessionPlan]) -> Child:
    """Builds and seals batch `seq` from exactly the sessions of `plans` (whole groups, fixed at creation: Jobs
    are immutable, so a restarted operator sees the same assignment and never seals a session twice). The
    Job is given the sessions' plans (tracefleet.operator.plans.for_sealer): it seals failed sessions too,
    whose pods may have left nothing that says which task they ran."""
    indices = [p.index for p in plans]
    spec = job.spec
    env = SealerEnv(bucket=spec.output.uri, endpoint=cfg.bucket_endpoint, job=job.name, batch_seq=seq, sessions=indices,
                    plans=[for_sealer(p) for p in plans], plan_dir=PLAN_FOLDER)
    name = n.sealer_job_name(job.name, seq)
    config_maps = plan_config_maps(job, name, n.COMPONENT_SEALER, env)
    container = pod_program("sealer", cfg.proxy_image, ["seal"], env.to_env(), bucket_env_from(job), SEALER_RESOURCES)
    batch = {n.LABEL_BATCH: str(seq)}
    meta = object_meta(job, name, n.COMPONENT_SEALER, annotations={n.ANNOTATION_SESSIONS: n.encode_ranges(indices)},
                       **batch)
    return Child(_batch_job(meta, child_labels(job, n.COMPONENT_SEALER, **batch),
                            _batch_pod_spec(job, cfg, container, config_maps, SESSION_PLANS), backoff_limit=4,
                            deadline_s=SEALER_DEADLINE_S), config_maps)
