"""The managed inference engine: vLLM's OpenAI server as a Deployment behind a Service."""

from __future__ import annotations

from typing import Any

from .. import names as n
from ..view import JobView
from .inputs import env_vars
from .metadata import Manifest, child_labels, metadata

ENGINE_PORT = 8000


def inference_service_url(job: JobView) -> str:
    if job.external_url:
        return job.external_url.rstrip("/")
    return f"http://{n.inference_name(job.name)}.{job.namespace}.svc:{ENGINE_PORT}"


def vllm_args(job: JobView) -> list[str]:
    m = job.managed
    assert m is not None
    args = [
        "--model", m.model,
        "--served-model-name", m.served_model_name,
        "--tensor-parallel-size", str(m.tensor_parallel_size),
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
    ]
    return args + list(m.extra_args)


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
        "env": env_vars(m.env),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
        "resources": resources,
        # Model download + load can take 10-15 minutes: the startup probe holds liveness off that long.
        "startupProbe": {**http("/v1/models"), "periodSeconds": 10, "failureThreshold": m.startup_timeout_s // 10},
        "readinessProbe": {**http("/v1/models"), "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**http("/health"), "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 5},
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
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, n.inference_name(job.name), n.COMPONENT_INFERENCE),
        "spec": {
            "selector": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE},
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
        },
    }
