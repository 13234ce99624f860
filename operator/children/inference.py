"""The managed inference engine: vLLM's OpenAI server as a Deployment behind a Service.

vLLM listens on the pod's loopback only; the pod's port is the engine gate's (`tracefleet engine-gate`, the tracefleet
image), which lets through only requests with the job's engine key, on every route but /health. The key is the job's
`apiKeySecretRef`, else a Secret the operator makes per job (owned by it): the gate, vLLM and each proxy sidecar get it
as `secretKeyRef` on their container alone, never a harness or task container (docs/harbor/cluster-network.md).
"""

from __future__ import annotations

import base64
import secrets

from kubernetes.client import (V1Container, V1ContainerPort, V1Deployment, V1DeploymentSpec, V1EmptyDirVolumeSource,
                               V1EnvVar, V1EnvVarSource, V1HTTPGetAction, V1LabelSelector, V1ObjectMeta,
                               V1PersistentVolumeClaimVolumeSource, V1PodSpec, V1PodTemplateSpec, V1Probe,
                               V1ResourceRequirements, V1Secret, V1SecretKeySelector, V1Service, V1ServicePort,
                               V1ServiceSpec, V1Volume, V1VolumeMount)

from tracefleet.contract import podenv
from tracefleet.contract.job import ManagedInference, RolloutJob, SecretKeyRef
from tracefleet.operator import names as n
from tracefleet.operator.children.inputs import env_vars, job_resources
from tracefleet.operator.children.metadata import Manifest, as_manifest, child_labels, job_pod_spec, namespace_of, object_meta
from tracefleet.operator.children.security import NON_ROOT_UID, container_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.vllm import HEALTH_PATH, VLLM_API_KEY_ENV, VllmServer, vllm_server

ENGINE_PORT = 8000  # the pod's, the Service's: the gate's
VLLM_LOOPBACK_PORT = 8001  # vLLM's, on 127.0.0.1: only the gate (and nothing outside the pod) reaches it
ENGINE_KEY_BYTES = 32
# Model download + load can take 10-15 minutes: the startup probe holds liveness off that long.
ENGINE_STARTUP_TIMEOUT_S = 900
GPU_RESOURCE = "nvidia.com/gpu"
HF_HOME = "HF_HOME"


def inference_service_url(job: RolloutJob) -> str:
    if (ext := job.spec.inference.external) is not None:
        return ext.base_url.rstrip("/")
    return f"http://{n.inference_name(job.name)}.{namespace_of(job)}.svc:{ENGINE_PORT}"


def _managed(job: RolloutJob) -> ManagedInference:
    m = job.spec.inference.managed
    assert m is not None, "external inference has no Deployment"
    return m


def _vllm(job: RolloutJob) -> VllmServer:
    """The same command line and environment the tests run real vLLM with (tracefleet.vllm.vllm_server)."""
    _managed(job)
    return vllm_server(job.spec.inference, host="127.0.0.1", port=VLLM_LOOPBACK_PORT)


def vllm_args(job: RolloutJob) -> list[str]:
    return _vllm(job).args


def vllm_env(job: RolloutJob) -> list[V1EnvVar]:
    """vLLM's own variables (dev mode for pause and weight routes), the model cache as $HF_HOME (vLLM
    downloads into $HF_HOME/hub), and its API key from the Secret."""
    cache = _managed(job).model_cache
    return env_vars({**_vllm(job).env, **({HF_HOME: cache.mount_path} if cache else {})}) + engine_api_key_env(job, VLLM_API_KEY_ENV)


GATE_OWNED_FLAGS = ("--host", "--port", "--api-key")


def extra_args_problem(job: RolloutJob) -> str | None:
    """Why the managed engine's extraArgs cannot run behind the gate, or None: where vLLM listens, and its key, are the
    operator's (a vLLM on the pod's port would leave the gate nowhere to listen; one on 0.0.0.0 would be open)."""
    m = job.spec.inference.managed
    given = sorted({a.split("=", 1)[0] for a in (m.extra_args or []) if a.split("=", 1)[0] in GATE_OWNED_FLAGS}) if m else []
    if not given:
        return None
    return (f"spec.inference.managed.extraArgs: {', '.join(given)} are the operator's (vLLM listens on the pod's "
            "loopback behind the engine gate, whose key is apiKeySecretRef's or the job's own)")


def engine_key_ref(job: RolloutJob) -> SecretKeyRef | None:
    """Where the engine's key is: the job's apiKeySecretRef, else (managed) the Secret the operator makes for the
    job; None for an external engine that needs none."""
    return job.spec.inference.api_key_secret_ref() or own_engine_key_ref(job)


def own_engine_key_ref(job: RolloutJob) -> SecretKeyRef | None:
    """The Secret the operator makes for the job's engine key: a managed engine whose job names no Secret of its own."""
    if job.spec.inference.managed is None or job.spec.inference.api_key_secret_ref() is not None:
        return None
    return SecretKeyRef(name=n.engine_key_secret_name(job.name), key=n.ENGINE_KEY_SECRET_KEY)


def engine_key_secret(job: RolloutJob) -> Manifest | None:
    """The job's engine key, made once (created, never updated: a later pass's fresh key does not replace it) and
    deleted with the job; None when the job names its own Secret or runs no engine."""
    if (ref := own_engine_key_ref(job)) is None:
        return None
    key = secrets.token_urlsafe(ENGINE_KEY_BYTES)
    return as_manifest(V1Secret(api_version="v1", kind="Secret", type="Opaque",
                                metadata=object_meta(job, ref.name, n.COMPONENT_INFERENCE),
                                data={ref.key: base64.b64encode(key.encode()).decode()}))


def engine_api_key_env(job: RolloutJob, name: str) -> list[V1EnvVar]:
    """`name` set from the engine's key Secret, or nothing when the engine needs no key."""
    if (ref := engine_key_ref(job)) is None:
        return []
    return [V1EnvVar(name=name, value_from=V1EnvVarSource(secret_key_ref=V1SecretKeySelector(name=ref.name, key=ref.key)))]


GATE_RESOURCES = V1ResourceRequirements(requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": "512Mi"})


def gate_container(job: RolloutJob, cfg: OperatorConfig) -> V1Container:
    """`tracefleet engine-gate` on the pod's port, in front of vLLM on loopback (tracefleet.proxy.engine_gate)."""
    return V1Container(
        name="gate", image=cfg.proxy_image, command=["tracefleet"],
        args=["engine-gate", "--host", "0.0.0.0", "--port", str(ENGINE_PORT),
              "--engine", f"http://127.0.0.1:{VLLM_LOOPBACK_PORT}"],
        env=engine_api_key_env(job, podenv.ENGINE_API_KEY),
        ports=[V1ContainerPort(name="http", container_port=ENGINE_PORT)], resources=GATE_RESOURCES,
        # the pod runs vLLM's image as it comes (root); the gate need not
        security_context=container_security_context(read_only_root=True, run_as=NON_ROOT_UID))


def _health_probe(period_s: int, failures: int, timeout_s: int | None = None) -> V1Probe:
    """Through the gate (the pod's port; vLLM answers loopback only): /health, not /v1/models, is the one route it lets
    through keyless (and it answers 503 once the engine died)."""
    return V1Probe(http_get=V1HTTPGetAction(path=HEALTH_PATH, port=ENGINE_PORT), period_seconds=period_s,
                   failure_threshold=failures, timeout_seconds=timeout_s)


def vllm_container(job: RolloutJob) -> V1Container:
    """vLLM's OpenAI server; GPUs by `nvidia.com/gpu` limits (and requests), none with gpusPerReplica 0 (vLLM's CPU
    build, on any node); /dev/shm and the model cache mounted."""
    m = _managed(job)
    gpus = {GPU_RESOURCE: str(m.gpus())} if m.gpus() else {}
    given = job_resources(m.resources)
    resources = V1ResourceRequirements(requests={**gpus, **((given and given.requests) or {})} or None,
                                       limits={**gpus, **((given and given.limits) or {})} or None)
    mounts = [V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    if m.model_cache is not None:
        mounts.append(V1VolumeMount(name="model-cache", mount_path=m.model_cache.mount_path))
    return V1Container(name="vllm", image=m.image, args=vllm_args(job), env=vllm_env(job), resources=resources,
                       startup_probe=_health_probe(10, ENGINE_STARTUP_TIMEOUT_S // 10),
                       readiness_probe=_health_probe(10, 3), liveness_probe=_health_probe(15, 4, timeout_s=5),
                       volume_mounts=mounts)


def inference_deployment(job: RolloutJob, cfg: OperatorConfig) -> Manifest:
    """vLLM's OpenAI server on loopback behind the engine gate (none with gpusPerReplica 0: vLLM's CPU build);
    /dev/shm as memory emptyDir."""
    m = _managed(job)
    volumes = [V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(medium="Memory"))]
    if m.model_cache is not None:
        volumes.append(V1Volume(name="model-cache", persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(
            claim_name=m.model_cache.claim_name)))
    pod_spec = job_pod_spec(job, cfg.image_pull_secrets,
                            V1PodSpec(containers=[vllm_container(job), gate_container(job, cfg)], volumes=volumes))
    selector = {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}
    return as_manifest(V1Deployment(
        api_version="apps/v1", kind="Deployment",
        metadata=object_meta(job, n.inference_name(job.name), n.COMPONENT_INFERENCE),
        spec=V1DeploymentSpec(replicas=0 if job.spec.suspend else m.replicas,
                              selector=V1LabelSelector(match_labels=selector),
                              template=V1PodTemplateSpec(metadata=V1ObjectMeta(
                                  labels=child_labels(job, n.COMPONENT_INFERENCE)), spec=pod_spec))))


def inference_service(job: RolloutJob) -> Manifest:
    # The prefix cache is per replica: one session's calls (one sidecar, one pod IP) stay on one replica,
    # so each turn's prompt, which extends the last, is served from that replica's cache.
    replicas = m.replicas if (m := job.spec.inference.managed) is not None else 1
    return as_manifest(V1Service(
        api_version="v1", kind="Service", metadata=object_meta(job, n.inference_name(job.name), n.COMPONENT_INFERENCE),
        spec=V1ServiceSpec(selector={n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE},
                           ports=[V1ServicePort(name="http", port=ENGINE_PORT, target_port="http")],
                           session_affinity="ClientIP" if replicas > 1 else None)))
