"""The managed inference engine: vLLM's OpenAI server as a Deployment behind a Service.

vLLM listens on the pod's loopback only; the pod's port is the engine gate's (`tracefleet engine-gate`, the tracefleet
image), which lets through only requests with the job's engine key, on every route but /health. The key is the job's
`apiKeySecretRef`, else a Secret the operator makes per job (owned by it): the gate, vLLM and each proxy sidecar get it
as `secretKeyRef` on their container alone, never a harness or task container (docs/harbor/cluster-network.md).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from tracefleet.contract import podenv
from tracefleet.contract.job import ManagedInference, RolloutJob, SecretKeyRef
from tracefleet.operator import names as n
from tracefleet.operator.children.inputs import env_vars
from tracefleet.operator.children.metadata import Manifest, child_labels, metadata, namespace_of, pod_fields
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


def vllm_env(job: RolloutJob) -> list[dict[str, Any]]:
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
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": metadata(job, ref.name, n.COMPONENT_INFERENCE),
            "data": {ref.key: base64.b64encode(key.encode()).decode()}}


def engine_api_key_env(job: RolloutJob, name: str) -> list[dict[str, Any]]:
    """`name` set from the engine's key Secret, or nothing when the engine needs no key."""
    if (ref := engine_key_ref(job)) is None:
        return []
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def gate_container(job: RolloutJob, cfg: OperatorConfig) -> dict[str, Any]:
    """`tracefleet engine-gate` on the pod's port, in front of vLLM on loopback (tracefleet.proxy.engine_gate)."""
    return {
        "name": "gate",
        "image": cfg.proxy_image,
        "command": ["tracefleet"],
        "args": ["engine-gate", "--host", "0.0.0.0", "--port", str(ENGINE_PORT),
                 "--engine", f"http://127.0.0.1:{VLLM_LOOPBACK_PORT}"],
        "env": engine_api_key_env(job, podenv.ENGINE_API_KEY),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        # the pod runs vLLM's image as it comes (root); the gate need not
        "securityContext": {**container_security_context(), "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID,
                            "readOnlyRootFilesystem": True},
    }


def inference_deployment(job: RolloutJob, cfg: OperatorConfig) -> Manifest:
    """vLLM's OpenAI server on loopback behind the engine gate; GPUs by `nvidia.com/gpu` limits (none with
    gpusPerReplica 0: vLLM's CPU build); /dev/shm as memory emptyDir."""
    m = _managed(job)
    name = n.inference_name(job.name)
    labels = child_labels(job, n.COMPONENT_INFERENCE)
    selector = {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}
    gpus = {GPU_RESOURCE: str(m.gpus())} if m.gpus() else {}  # none: vLLM's CPU build, on any node
    resources: dict[str, Any] = {"limits": dict(gpus), "requests": dict(gpus)}
    given = m.resources.model_dump(mode="json", exclude_none=True) if m.resources else {}
    resources["requests"].update(given.get("requests") or {})
    resources["limits"].update(given.get("limits") or {})
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if m.model_cache is not None:
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": m.model_cache.claim_name}})
        mounts.append({"name": "model-cache", "mountPath": m.model_cache.mount_path})
    # through the gate (the pod's port; vLLM answers loopback only): /health is the one route it lets through keyless
    http = lambda path: {"httpGet": {"path": path, "port": ENGINE_PORT}}  # noqa: E731
    container = {
        "name": "vllm",
        "image": m.image,
        "args": vllm_args(job),
        "env": vllm_env(job),
        "resources": resources,
        # /health, not /v1/models: only /health answers without the API key (and 503 once the engine died).
        "startupProbe": {**http(HEALTH_PATH), "periodSeconds": 10, "failureThreshold": ENGINE_STARTUP_TIMEOUT_S // 10},
        "readinessProbe": {**http(HEALTH_PATH), "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**http(HEALTH_PATH), "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container, gate_container(job, cfg)],
        "volumes": volumes,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        **pod_fields(job, cfg.image_pull_secrets),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata(job, name, n.COMPONENT_INFERENCE)},
        "spec": {
            "replicas": 0 if job.spec.suspend else m.replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def inference_service(job: RolloutJob) -> Manifest:
    spec: dict[str, Any] = {
        "selector": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE},
        "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
    }
    if (m := job.spec.inference.managed) is not None and m.replicas > 1:
        # The prefix cache is per replica: one session's calls (one sidecar, one pod IP) stay on one replica,
        # so each turn's prompt, which extends the last, is served from that replica's cache.
        spec["sessionAffinity"] = "ClientIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, n.inference_name(job.name), n.COMPONENT_INFERENCE),
        "spec": spec,
    }
