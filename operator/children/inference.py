"""The managed inference engine: vLLM's OpenAI server as a Deployment behind a Service."""

from __future__ import annotations

from typing import Any

from tracefleet.vllm import HEALTH_PATH, VLLM_API_KEY_ENV, VllmServer, vllm_server

from .. import names as n
from ..view import JobView
from .inputs import env_vars
from .metadata import Manifest, child_labels, metadata

ENGINE_PORT = 8000


def inference_service_url(job: JobView) -> str:
    if job.external_url:
        return job.external_url.rstrip("/")
    return f"http://{n.inference_name(job.name)}.{job.namespace}.svc:{ENGINE_PORT}"


def _vllm(job: JobView) -> VllmServer:
    """The same command line and environment the tests run real vLLM with (tracefleet.vllm.vllm_server)."""
    assert job.inference is not None and job.managed is not None, "external inference has no Deployment"
    return vllm_server(job.inference, host="0.0.0.0", port=ENGINE_PORT)


def vllm_args(job: JobView) -> list[str]:
    return _vllm(job).args


def vllm_env(job: JobView) -> list[dict[str, Any]]:
    """vLLM's own variables (dev mode for pause and weight routes), the job's, and its API key from the Secret."""
    assert job.managed is not None
    return env_vars({**_vllm(job).env, **job.managed.env}) + engine_api_key_env(job, VLLM_API_KEY_ENV)


def engine_api_key_env(job: JobView, name: str) -> list[dict[str, Any]]:
    """`name` set from the engine's API-key Secret, or nothing when the engine needs no key."""
    if job.engine_api_key is None:
        return []
    secret, key = job.engine_api_key
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}]


def inference_deployment(job: JobView) -> Manifest:
    """vLLM's OpenAI server; GPUs by `nvidia.com/gpu` limits; /dev/shm as memory emptyDir."""
    m = job.managed
    assert m is not None, "external inference has no Deployment"
    name = n.inference_name(job.name)
    labels = child_labels(job, n.COMPONENT_INFERENCE)
    selector = {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": str(m.gpus)}, "requests": {"nvidia.com/gpu": str(m.gpus)}}
    for k, v in (m.resources.get("requests") or {}).items():
        resources["requests"][k] = v
    for k, v in (m.resources.get("limits") or {}).items():
        resources["limits"][k] = v
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", **({"sizeLimit": m.shm_size} if m.shm_size else {})}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if m.cache_path:
        volumes.append(
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": m.cache_claim}}
            if m.cache_claim
            else {"name": "model-cache", "emptyDir": {}}
        )
        mounts.append({"name": "model-cache", "mountPath": m.cache_path})
    http = lambda path: {"httpGet": {"path": path, "port": "http"}}  # noqa: E731
    container = {
        "name": "vllm",
        "image": m.image,
        "args": vllm_args(job),
        "env": vllm_env(job),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "resources": resources,
        # Model download + load can take 10-15 minutes: the startup probe holds liveness off that long.
        # /health, not /v1/models: only /health answers without the API key (and 503 once the engine died).
        "startupProbe": {**http(HEALTH_PATH), "periodSeconds": 10, "failureThreshold": m.startup_timeout_s // 10},
        "readinessProbe": {**http(HEALTH_PATH), "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**http(HEALTH_PATH), "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if job.priority_class:
        pod_spec["priorityClassName"] = job.priority_class
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata(job, name, n.COMPONENT_INFERENCE)},
        "spec": {
            "replicas": 0 if job.suspend else m.replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def inference_service(job: JobView) -> Manifest:
    spec: dict[str, Any] = {
        "selector": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE},
        "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
    }
    if job.managed is not None and job.managed.replicas > 1:
        # The prefix cache is per replica: one session's calls (one sidecar, one pod IP) stay on one replica,
        # so each turn's prompt, which extends the last, is served from that replica's cache.
        spec["sessionAffinity"] = "ClientIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, n.inference_name(job.name), n.COMPONENT_INFERENCE),
        "spec": spec,
    }
