"""The harness pod: one session = the harness container plus the capture proxy as a native sidecar."""

from __future__ import annotations

import math
import secrets

from kubernetes.client import (V1Container, V1ContainerPort, V1EmptyDirVolumeSource, V1HTTPGetAction,
                               V1PersistentVolumeClaimVolumeSource, V1Pod, V1PodSpec, V1Probe, V1ResourceRequirements,
                               V1Volume, V1VolumeMount)

from tracefleet.contract import layout, podenv
from tracefleet.contract import task_image as ti
from tracefleet.contract.job import ModelCache, RolloutJob
from tracefleet.contract.plan_files import PLAN_FOLDER, SESSION_PLAN, SIDECAR_PLAN
from tracefleet.contract.podenv import HarnessEnv, ProxySidecarEnv
from tracefleet.contract.proxy_plan import SidecarPlan
from tracefleet.contract.session import SessionPlan
from tracefleet.contract.sidecar_resources import proxy_resources
from tracefleet.operator import names as n
from tracefleet.operator.children.inference import engine_api_key_env
from tracefleet.operator.children.inputs import bucket_env_from, env_vars, job_resources, resource_requirements
from tracefleet.operator.children.metadata import Manifest, as_manifest, job_pod_spec, object_meta
from tracefleet.operator.children.network_policy import network_labels
from tracefleet.operator.children.plan_volume import Child, plan_config_maps, plan_mount, plan_volume
from tracefleet.operator.children.security import container_security_context, pod_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.children.task_image import (
    bundle_init_container,
    session_container,
    shared_volume,
    task_harness_container,
)
from tracefleet.operator.harbor_tasks import ClusterHarborTask
from tracefleet.operator.plans import proxy_plan

PROXY_PORT = 8100
# Where the containers of a harness pod meet: the harness writes ARTIFACTS_DIR, which the sidecar
# mounts read-only and uploads with the capture log it keeps in CAPTURE_DIR.
CAPTURE_DIR = "/capture"
ARTIFACTS_DIR = "/artifacts"
WORKSPACE_DIR = "/workspace"  # a Harbor task's session program prepares its workspace here
# The session program prepares the workspace in SESSION_DIR (tracefleet.runner.workspace); the harness container has
# the harness's copy (layout.WORKDIR, a subPath of the same volume) at spec.harness.workspace.workdir, where it starts,
# as `tracefleet run` starts it (tracefleet.runner.netns).
SESSION_DIR = "/tracefleet/session"
HOME_DIR = "/home/harness"
# Proxy needs a moment after the harness exits to flush and upload the capture.
SESSION_DEADLINE_GRACE_S = 120
HARNESS_RESOURCES = V1ResourceRequirements(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "4Gi"})
SIDECAR_PLAN_VOLUME = "proxy-plan"  # the sidecar's own plan: the harness container does not mount it
TOKENIZER_VOLUME = "tokenizer-cache"
# the pod's emptyDirs: the capture log, the harness's artifacts, the workspace, the harness's HOME, the proxy's /tmp
SCRATCH_VOLUMES = ("capture", "artifacts", "workspace", "home", "proxy-tmp")


def session_secret() -> str:
    return "tfs_" + secrets.token_urlsafe(24)


def harness_pod(job: RolloutJob, cfg: OperatorConfig, plan: SessionPlan, attempt: int, secret: str | None = None,
                harbor: ClusterHarborTask | None = None) -> Child:
    """One session = one pod: the harness container plus the proxy as a native sidecar. The session's `plan`
    (tracefleet.operator.plans) goes to the session program whole, the job's proxy plan to the sidecar whole, both as
    files (children.plan_volume).

    The sidecar is an init container with `restartPolicy: Always`: it starts (and is probed ready)
    before the harness, and the pod still completes when the harness exits. A Harbor task (`harbor`) runs
    its harness in the task's own image, the session program beside it (tracefleet.operator.children.task_image).
    """
    name = n.harness_pod_name(job.name, plan.index, attempt)
    secret = secret or session_secret()
    sidecar_env = ProxySidecarEnv(plan=sidecar_plan(job, plan), session_secret=secret, endpoint=cfg.bucket_endpoint,
                                  plan_dir=PLAN_FOLDER)
    pod_env = HarnessEnv(plan=plan.model_copy(update={"attempt": attempt}), base_url=f"http://127.0.0.1:{PROXY_PORT}",
                         api_key=secret, artifacts_dir=ARTIFACTS_DIR, plan_dir=PLAN_FOLDER,
                         launch_dir=ti.LAUNCH_DIR if harbor is not None else None,
                         work_dir=SESSION_DIR if harbor is None else None)
    config_maps = plan_config_maps(job, name, n.COMPONENT_HARNESS, pod_env, sidecar_env)
    spec = job_pod_spec(job, cfg.image_pull_secrets, V1PodSpec(
        restart_policy="Never", security_context=pod_security_context(),
        active_deadline_seconds=math.ceil(plan.harness.timeout_s) + SESSION_DEADLINE_GRACE_S,
        termination_grace_period_seconds=30, runtime_class_name=job.spec.harness.runtime_class_name or None,
        init_containers=[_sidecar(job, cfg, sidecar_env)], containers=[],
        volumes=_volumes(job, config_maps)))
    _add_harness(spec, job, cfg, plan, pod_env, harbor)
    task, sample = n.task_sample_of(plan.index, job.spec.tasks.samples_per_task)
    labels = {n.LABEL_SESSION: str(plan.index), n.LABEL_TASK: str(task), n.LABEL_SAMPLE: str(sample),
              n.LABEL_ATTEMPT: str(attempt), **network_labels(harbor, "agent")}
    pod = V1Pod(api_version="v1", kind="Pod", metadata=object_meta(job, name, n.COMPONENT_HARNESS, **labels), spec=spec)
    return Child(as_manifest(pod), config_maps)


def _volumes(job: RolloutJob, config_maps: list[Manifest]) -> list[V1Volume]:
    volumes = [*(V1Volume(name=v, empty_dir=V1EmptyDirVolumeSource()) for v in SCRATCH_VOLUMES),
               plan_volume(config_maps, SESSION_PLAN), plan_volume(config_maps, SIDECAR_PLAN, SIDECAR_PLAN_VOLUME)]
    if (cache := _sidecar_tokenizer_cache(job)) is not None:
        volumes.append(V1Volume(name=TOKENIZER_VOLUME, persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
            claim_name=cache.claim_name, read_only=True)))
    return volumes


def _add_harness(spec: V1PodSpec, job: RolloutJob, cfg: OperatorConfig, plan: SessionPlan, env: HarnessEnv,
                 harbor: ClusterHarborTask | None) -> None:
    """The harness's containers: the session program running the harness CLI, or for a Harbor task the task's image
    running the harness beside the session program (on the pod's own inputs only)."""
    home = V1VolumeMount(name="home", mount_path=HOME_DIR)
    mounts = [home, V1VolumeMount(name="artifacts", mount_path=ARTIFACTS_DIR), plan_mount()]
    harness = _harness_container(job, plan, env, mounts)
    if harbor is None:
        spec.containers = [harness]
        return
    spec.init_containers = [*(spec.init_containers or []), bundle_init_container(job)]
    spec.containers = [task_harness_container(harbor, harness.resources, home),
                       session_container(cfg, {**env.to_env(), "HOME": HOME_DIR},
                                         [V1VolumeMount(name="workspace", mount_path=WORKSPACE_DIR), *mounts],
                                         WORKSPACE_DIR)]
    spec.volumes = [*(spec.volumes or []), shared_volume()]


def sidecar_plan(job: RolloutJob, plan: SessionPlan) -> SidecarPlan:
    """The sidecar's plan: the job's proxy (tracefleet.operator.plans.proxy_plan) for this session, whose capture
    and artifacts it uploads to the session's folder in the bucket when the pod stops (tracefleet.proxy.upload)."""
    return SidecarPlan(proxy=proxy_plan(job), session_id=plan.session_id,
                       upload_to=layout.session_uri(job.spec.output.uri, job.name, plan.index))


def _health_probe(period_s: int, failures: int | None = None) -> V1Probe:
    return V1Probe(http_get=V1HTTPGetAction(path="/health", port="proxy"), period_seconds=period_s,
                   failure_threshold=failures)


def _sidecar(job: RolloutJob, cfg: OperatorConfig, env: ProxySidecarEnv) -> V1Container:
    """The proxy: its plan from files, its flags its place's own (where it listens, its folders)."""
    mounts = [V1VolumeMount(name="capture", mount_path=CAPTURE_DIR),
              V1VolumeMount(name="artifacts", mount_path=ARTIFACTS_DIR, read_only=True),
              V1VolumeMount(name="proxy-tmp", mount_path="/tmp"), plan_mount(SIDECAR_PLAN_VOLUME)]
    if (cache := _sidecar_tokenizer_cache(job)) is not None:
        mounts.append(V1VolumeMount(name=TOKENIZER_VOLUME, mount_path=cache.mount_path, read_only=True))
    return V1Container(
        name="proxy", image=cfg.proxy_image, command=["tracefleet"],
        args=["proxy", "--in-pod", "--host", "0.0.0.0", "--port", str(PROXY_PORT), "--capture-dir", CAPTURE_DIR,
              "--artifacts-dir", ARTIFACTS_DIR],
        restart_policy="Always",
        env=env_vars({**env.to_env(), **_tokenizer_env(job)}) + engine_api_key_env(job, podenv.ENGINE_API_KEY),
        env_from=bucket_env_from(job), ports=[V1ContainerPort(name="proxy", container_port=PROXY_PORT)],
        startup_probe=_health_probe(1, 60), readiness_probe=_health_probe(5),
        resources=resource_requirements(proxy_resources(env.plan.proxy.mode, job.spec.inference.capture.proxy_resources)),
        security_context=container_security_context(read_only_root=True), volume_mounts=mounts)


def _harness_container(job: RolloutJob, plan: SessionPlan, env: HarnessEnv, mounts: list[V1VolumeMount]) -> V1Container:
    """The runner's in-pod entrypoint (`tracefleet run --in-pod`): prepares the workspace, launches the preset's CLI
    against the sidecar and writes the artifacts the sidecar uploads."""
    h = job.spec.harness
    # The harness process takes spec.harness.env from the plan (tracefleet.runner.environment: over the preset's
    # variables); the container has it too, for the pod program's own steps (workspace setup), as before. First:
    # the pod program's own inputs (TRACEFLEET_*, HOME) are not the job's to change.
    harness_env = {**{k: str(v) for k, v in (h.env or {}).items()}, **env.to_env(), "HOME": HOME_DIR}
    return V1Container(
        name="harness", image=h.image, command=["tracefleet", "run", "--in-pod"], working_dir=plan.harness.workdir,
        env=env_vars(harness_env), resources=job_resources(h.resources) or HARNESS_RESOURCES,
        security_context=container_security_context(),
        volume_mounts=[V1VolumeMount(name="workspace", mount_path=SESSION_DIR),
                       V1VolumeMount(name="workspace", mount_path=plan.harness.workdir, sub_path=layout.WORKDIR),
                       *mounts])


def _sidecar_tokenizer_cache(job: RolloutJob) -> ModelCache | None:
    """The volume the proxy sidecar mounts read-only to read the tokenizer; None in server mode."""
    inference = job.spec.inference
    return None if inference.capture.mode == "server" else inference.capture_tokenizer_cache()


def _tokenizer_env(job: RolloutJob) -> dict[str, str]:
    if (cache := _sidecar_tokenizer_cache(job)) is None:
        return {}
    # never download in the sandbox: the tokenizer is in the mounted cache or exact mode is off
    return {"HF_HOME": cache.mount_path, "HF_HUB_OFFLINE": "1"}


def exact_mode_problem(job: RolloutJob) -> str | None:
    """Why `capture.mode: exact` cannot work on the cluster, or None (auto falls back to server instead)."""
    inference = job.spec.inference
    if inference.capture.mode == "exact" and inference.capture_tokenizer_cache() is None:
        return ("spec.inference.capture.mode exact needs the model's tokenizer inside every proxy sidecar: set "
                "spec.inference.managed.modelCache or spec.inference.capture.tokenizerCache (a claim holding it), "
                "or use mode auto, which falls back to server capture")
    return None
