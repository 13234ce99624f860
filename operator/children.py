"""Pure functions: RolloutJob (seen through `JobView`) -> child manifests as plain dicts.

No API calls here, so every security and scheduling property of a child is unit-testable:
GPU limits and probes of the inference Deployment, the harness pod's native proxy sidecar,
its sandboxing (no service-account token, non-root, runtimeClassName, deadline), labels and
ownerReferences, the per-job NetworkPolicy, evaluator and sealer Jobs.

Data path (design §6): the proxy sidecar records the capture log on a volume shared with the
harness container and, when the pod stops, uploads capture + artifacts to
`<bucket>/<job>/sessions/<session>/`; the evaluator Job reads them and writes `reward.json`
there; a sealer Job builds and seals `<bucket>/<job>/batches/<seq>/` from a fixed set of
sessions. Harness pods never hold bucket credentials nor RBAC.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlparse

from . import names as n
from .view import JobView, OperatorConfig

PROXY_PORT = 8100
ENGINE_PORT = 8000
# Proxy needs a moment after the harness exits to flush and upload the capture.
SESSION_DEADLINE_GRACE_S = 120
NON_ROOT_UID = 65532

Manifest = dict[str, Any]


def owner_reference(job: JobView) -> dict[str, Any]:
    return {
        "apiVersion": n.API_VERSION,
        "kind": n.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_labels(job: JobView, component: str, **extra: str) -> dict[str, str]:
    labels = {
        n.LABEL_JOB: job.name,
        n.LABEL_COMPONENT: component,
        n.LABEL_MANAGED_BY: n.MANAGED_BY,
    }
    # Kueue admits and prioritises by these labels on the workload's pods.
    for k, v in job.labels.items():
        if k.startswith(n.PROPAGATED_LABEL_PREFIXES):
            labels[k] = v
    labels.update({k: str(v) for k, v in extra.items()})
    return labels


def _metadata(job: JobView, name: str, component: str, **labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": child_labels(job, component, **labels),
        "ownerReferences": [owner_reference(job)],
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def _env(items: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": str(v)} for k, v in items.items()]


def _bucket_env(job: JobView) -> list[dict[str, Any]]:
    env = _env({"TRACEFLEET_BUCKET": job.bucket_uri})
    if job.bucket_endpoint:
        env += _env({"AWS_ENDPOINT_URL": job.bucket_endpoint})
    return env


def _bucket_env_from(job: JobView) -> list[dict[str, Any]]:
    if not job.credentials_secret:
        return []
    return [{"secretRef": {"name": job.credentials_secret}}]


# ---------------------------------------------------------------- inference


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
        "env": _env(m.env),
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
        "metadata": {**_metadata(job, name, n.COMPONENT_INFERENCE)},
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
        "metadata": _metadata(job, n.inference_name(job.name), n.COMPONENT_INFERENCE),
        "spec": {
            "selector": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE},
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
        },
    }


# ---------------------------------------------------------------- harness pods


def session_secret() -> str:
    return "tfs_" + secrets.token_urlsafe(24)


def harness_pod(job: JobView, cfg: OperatorConfig, session: int, attempt: int, secret: str | None = None) -> Manifest:
    """One session = one pod: the harness container plus the proxy as a native sidecar.

    The sidecar is an init container with `restartPolicy: Always`: it starts (and is probed ready)
    before the harness, and the pod still completes when the harness exits.
    """
    task, sample = n.task_sample_of(session, job.samples_per_task)
    name = n.harness_pod_name(job.name, session, attempt)
    secret = secret or session_secret()
    session_id = f"{job.name}-s{session}"
    h = job.harness
    proxy_args = [
        "proxy",
        "--host", "0.0.0.0",
        "--port", str(PROXY_PORT),
        "--engine", inference_service_url(job),
        "--capture-dir", "/capture",
        "--mode", job.capture_mode,
        *_exact_mode_args(job),
        *(["--served-model", job.served_model] if job.served_model else []),
        "--policy-version", str(job.policy_version),
        # the kubelet expands $(VAR) from the container's env: the secret stays out of the args
        "--session", f"{session_id}:$(TRACEFLEET_SESSION_SECRET)",
        # on SIGTERM (the pod stopping after the harness exits) upload capture.jsonl + the harness's
        # artifacts to the session's prefix (tracefleet.proxy.upload)
        "--upload-to", f"{job.bucket_uri.rstrip('/')}/{job.name}/sessions/{session}/",
        "--artifacts-dir", "/artifacts",
    ]
    proxy = {
        "name": "proxy",
        "image": cfg.proxy_image,
        "command": ["tracefleet"],
        "args": proxy_args,
        "restartPolicy": "Always",
        "env": _env({"TRACEFLEET_SESSION_SECRET": secret, **_tokenizer_env(job)}) + _bucket_env(job),
        "envFrom": _bucket_env_from(job),
        "ports": [{"name": "proxy", "containerPort": PROXY_PORT}],
        "startupProbe": {"httpGet": {"path": "/health", "port": "proxy"}, "periodSeconds": 1, "failureThreshold": 60},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "proxy"}, "periodSeconds": 5},
        # exact mode holds the model's tokenizer (a large vocabulary is ~100-200 MiB) and the served ids
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi" if job.capture_mode == "server" else "256Mi"},
                      "limits": {"memory": "512Mi" if job.capture_mode == "server" else "1Gi"}},
        "securityContext": {**container_security_context(), "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "capture", "mountPath": "/capture"},
            {"name": "artifacts", "mountPath": "/artifacts", "readOnly": True},
            {"name": "proxy-tmp", "mountPath": "/tmp"},
        ],
    }
    if (cache := _sidecar_tokenizer_cache(job)) is not None:
        proxy["volumeMounts"].append({"name": "tokenizer-cache", "mountPath": cache[1], "readOnly": True})
    harness_env = {
        "TRACEFLEET_JOB": job.name,
        "TRACEFLEET_SESSION": str(session),
        "TRACEFLEET_SESSION_ID": session_id,
        "TRACEFLEET_TASK_INDEX": str(task),
        "TRACEFLEET_SAMPLE_INDEX": str(sample),
        "TRACEFLEET_ATTEMPT": str(attempt),
        "TRACEFLEET_BASE_URL": f"http://127.0.0.1:{PROXY_PORT}",
        "TRACEFLEET_API_KEY": secret,
        "TRACEFLEET_MODEL": job.served_model,
        "TRACEFLEET_PRESET": h.preset or "command",
        "TRACEFLEET_TIMEOUT_S": str(h.timeout_s),
        "TRACEFLEET_ARTIFACTS_DIR": "/artifacts",
        "HOME": "/home/harness",
    }
    volumes: list[dict[str, Any]] = [
        {"name": "capture", "emptyDir": {}},
        {"name": "artifacts", "emptyDir": {}},
        {"name": "workspace", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "proxy-tmp", "emptyDir": {}},
    ]
    mounts = [
        {"name": "workspace", "mountPath": "/workspace"},
        {"name": "home", "mountPath": "/home/harness"},
        {"name": "artifacts", "mountPath": "/artifacts"},
    ]
    if (cache := _sidecar_tokenizer_cache(job)) is not None:
        volumes.append({"name": "tokenizer-cache",
                        "persistentVolumeClaim": {"claimName": cache[0], "readOnly": True}})
    task_env, task_volumes, task_mounts = _task_source(job, task)
    harness_env.update(task_env)
    volumes += task_volumes
    mounts += task_mounts
    if h.command:
        harness_env["TRACEFLEET_COMMAND_JSON"] = __import__("json").dumps(list(h.command))
    if h.workspace_setup:
        harness_env["TRACEFLEET_WORKSPACE_SETUP_JSON"] = __import__("json").dumps(list(h.workspace_setup))
    harness_env.update({k: str(v) for k, v in h.env.items()})
    harness = {
        "name": "harness",
        "image": h.image,
        # The runner's in-pod entrypoint: prepares /workspace, launches the preset's CLI against
        # the sidecar proxy, and writes artifacts (e.g. git diff) to /artifacts.
        "command": ["tracefleet", "run", "--in-pod"],
        "workingDir": "/workspace",
        "env": _env(harness_env),
        "resources": dict(h.resources) if h.resources else {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "activeDeadlineSeconds": h.timeout_s + SESSION_DEADLINE_GRACE_S,
        "terminationGracePeriodSeconds": 30,
        "initContainers": [proxy],
        "containers": [harness],
        "volumes": volumes,
    }
    if h.runtime_class:
        spec["runtimeClassName"] = h.runtime_class
    if job.priority_class:
        spec["priorityClassName"] = job.priority_class
    labels = {
        n.LABEL_SESSION: str(session),
        n.LABEL_TASK: str(task),
        n.LABEL_SAMPLE: str(sample),
        n.LABEL_ATTEMPT: str(attempt),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, name, n.COMPONENT_HARNESS, **labels),
        "spec": spec,
    }


def _sidecar_tokenizer_cache(job: JobView) -> tuple[str, str] | None:
    """(claim, mount path) the proxy sidecar mounts read-only to read the tokenizer; None in server mode."""
    return None if job.capture_mode == "server" else job.tokenizer_cache


def _exact_mode_args(job: JobView) -> list[str]:
    """The proxy's exact-mode flags: where to read the tokenizer (a hub id resolves in the mounted
    model cache, the layout vLLM downloads into) and the family/parser overrides."""
    if job.capture_mode == "server":
        return []
    return [*(["--model-path", job.capture_tokenizer] if job.capture_tokenizer else []),
            *(["--model-family", job.capture_family] if job.capture_family else []),
            *(["--tool-parser", job.capture_tool_parser] if job.capture_tool_parser else [])]


def _tokenizer_env(job: JobView) -> dict[str, str]:
    if (cache := _sidecar_tokenizer_cache(job)) is None:
        return {}
    # never download in the sandbox: the tokenizer is in the mounted cache or exact mode is off
    return {"HF_HOME": cache[1], "HF_HUB_OFFLINE": "1"}


def exact_mode_problem(job: JobView) -> str | None:
    """Why `capture.mode: exact` cannot work on the cluster, or None (auto falls back to server instead)."""
    if job.capture_mode == "exact" and job.tokenizer_cache is None:
        return ("spec.inference.capture.mode exact needs the model's tokenizer inside every proxy sidecar: set "
                "spec.inference.managed.modelCache or spec.inference.capture.tokenizerCache (a claim holding it), "
                "or use mode auto, which falls back to server capture")
    return None


def _task_source(job: JobView, task: int) -> tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, volumes, mounts) that give a pod its task; the harness pod and the evaluator Job read it
    the same way (tracefleet.runner.pod.task_from_env), and neither needs API access for it."""
    if job.tasks_inline is not None:
        # Inline tasks travel in the pod itself.
        import json

        return {"TRACEFLEET_TASK_JSON": json.dumps(job.tasks_inline[task], sort_keys=True)}, [], []
    if job.tasks_configmap:
        return (
            {"TRACEFLEET_TASKS_FILE": f"/tasks/{job.tasks_configmap[1]}"},
            [{"name": "tasks", "configMap": {"name": job.tasks_configmap[0]}}],
            [{"name": "tasks", "mountPath": "/tasks", "readOnly": True}],
        )
    if job.tasks_uri:
        return {"TRACEFLEET_TASKS_URI": job.tasks_uri}, [], []
    return {}, [], []


def _endpoint_peer(url: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """NetworkPolicy peers + ports for a URL outside the cluster's pod selectors.

    NetworkPolicy cannot match host names: an IP literal gets a /32 ipBlock, a name gets the
    port only (the DNS rule lets it resolve)."""
    if not url:
        return [], []
    u = urlparse(url if "://" in url else f"https://{url}")
    port = u.port or (443 if u.scheme == "https" else 80)
    host = u.hostname or ""
    import ipaddress

    try:
        ip = ipaddress.ip_address(host)
        peers = [{"ipBlock": {"cidr": f"{ip}/{32 if ip.version == 4 else 128}"}}]
    except ValueError:
        peers = []
    return peers, [{"protocol": "TCP", "port": port}]


def harness_network_policy(job: JobView) -> Manifest:
    """Harness pods: no ingress at all; egress only to the inference pods, the bucket and DNS.

    The harness and its proxy share a pod network namespace, so the pod-level policy is what the
    proxy needs; the harness reaches the proxy over loopback, which no policy can (or needs to) see.
    """
    egress: list[dict[str, Any]] = [
        {
            "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
    ]
    if job.managed is not None:
        egress.append(
            {
                "to": [{"podSelector": {"matchLabels": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_INFERENCE}}}],
                "ports": [{"protocol": "TCP", "port": ENGINE_PORT}],
            }
        )
    else:
        peers, ports = _endpoint_peer(job.external_url)
        egress.append({**({"to": peers} if peers else {}), "ports": ports})
    if job.bucket_endpoint or job.bucket_uri.startswith("s3://"):
        peers, ports = _endpoint_peer(job.bucket_endpoint or "https://s3.amazonaws.com")
        egress.append({**({"to": peers} if peers else {}), "ports": ports})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, n.network_policy_name(job.name), n.COMPONENT_HARNESS),
        "spec": {
            "podSelector": {"matchLabels": {n.LABEL_JOB: job.name, n.LABEL_COMPONENT: n.COMPONENT_HARNESS}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


# ---------------------------------------------------------------- evaluator and sealer Jobs


# Exit code an evaluator uses for "this session's artifacts are unusable": retrying cannot help.
EVALUATOR_FATAL_EXIT_CODE = 3


def _batch_pod_spec(job: JobView, container: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "containers": [{**container, "securityContext": container_security_context()}],
    }
    if job.priority_class:
        spec["priorityClassName"] = job.priority_class
    return spec


def evaluator_job(job: JobView, cfg: OperatorConfig, session: int) -> Manifest:
    """Scores one finished session in a fresh pod: reads `sessions/<s>/` and writes `reward.json`."""
    e = job.evaluator
    assert e is not None, "a job without an evaluator has no evaluator Jobs"
    task, sample = n.task_sample_of(session, job.samples_per_task)
    labels = {n.LABEL_SESSION: str(session), n.LABEL_TASK: str(task), n.LABEL_SAMPLE: str(sample)}
    env = {
        "TRACEFLEET_JOB": job.name,
        "TRACEFLEET_SESSION": str(session),
        "TRACEFLEET_TASK_INDEX": str(task),
        "TRACEFLEET_SAMPLE_INDEX": str(sample),
        "TRACEFLEET_SESSION_PREFIX": f"{job.bucket_uri.rstrip('/')}/{job.name}/sessions/{session}/",
    }
    if e.preset:
        env["TRACEFLEET_EVALUATOR"] = e.preset
    if e.command:
        env["TRACEFLEET_COMMAND_JSON"] = __import__("json").dumps(list(e.command))
    if e.entry_point:
        env["TRACEFLEET_EVALUATOR_ENTRYPOINT"] = e.entry_point
    env["TRACEFLEET_TIMEOUT_S"] = str(e.timeout_s)
    # The evaluator judges against the task the operator knows, never one the harness could rewrite.
    task_env, task_volumes, task_mounts = _task_source(job, task)
    env.update(task_env)
    container = {
        "name": "evaluator",
        "image": e.image or cfg.evaluator_image,
        "command": ["python", "-m", "tracefleet.operator.podmain", "evaluate"],
        "env": _env(env) + _bucket_env(job),
        "envFrom": _bucket_env_from(job),
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        **({"volumeMounts": task_mounts} if task_mounts else {}),
    }
    pod_spec = _batch_pod_spec(job, container)
    if task_volumes:
        pod_spec["volumes"] = task_volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job, n.evaluator_job_name(job.name, session), n.COMPONENT_EVALUATOR, **labels),
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": e.timeout_s,
            # Evictions and preemptions are not the evaluator's fault; a known-bad exit code is final.
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "evaluator", "operator": "In", "values": [EVALUATOR_FATAL_EXIT_CODE]},
                    },
                ]
            },
            "template": {
                "metadata": {"labels": child_labels(job, n.COMPONENT_EVALUATOR, **labels)},
                "spec": pod_spec,
            },
        },
    }


def sealer_job(job: JobView, cfg: OperatorConfig, seq: int, sessions: list[int]) -> Manifest:
    """Builds and seals batch `seq` from exactly `sessions` (fixed at creation: Jobs are immutable,
    so a restarted operator sees the same assignment and never seals a session twice)."""
    ranges = n.encode_ranges(sessions)
    env = {
        "TRACEFLEET_JOB": job.name,
        "TRACEFLEET_BATCH_SEQ": str(seq),
        "TRACEFLEET_SESSIONS": ranges,
        "TRACEFLEET_BUILDER": job.builder,
    }
    container = {
        "name": "sealer",
        "image": cfg.proxy_image,
        "command": ["python", "-m", "tracefleet.operator.podmain", "seal"],
        "env": _env(env) + _bucket_env(job),
        "envFrom": _bucket_env_from(job),
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
    }
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job, n.sealer_job_name(job.name, seq), n.COMPONENT_SEALER, **{n.LABEL_BATCH: str(seq)}),
        "spec": {
            "backoffLimit": 4,
            "activeDeadlineSeconds": 3600,
            "template": {
                "metadata": {"labels": child_labels(job, n.COMPONENT_SEALER, **{n.LABEL_BATCH: str(seq)})},
                "spec": _batch_pod_spec(job, container),
            },
        },
    }
    manifest["metadata"]["annotations"] = {n.ANNOTATION_SESSIONS: ranges}
    return manifest
