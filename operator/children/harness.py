"""The harness pod: one session = the harness container plus the capture proxy as a native sidecar."""

from __future__ import annotations

import secrets
from typing import Any

from tracefleet.contract import layout, podenv
from tracefleet.contract.engine_limits import logprobs_mode_flags
from tracefleet.contract.job import ModelCache, RolloutJob
from tracefleet.contract.session import SessionPlan
from tracefleet.contract.sidecar_resources import proxy_resources
from tracefleet.operator import names as n
from tracefleet.operator.children.inference import engine_api_key_env, inference_service_url
from tracefleet.operator.children.inputs import bucket_env_from, env_ref, env_vars
from tracefleet.operator.children.metadata import Manifest, metadata, pod_fields
from tracefleet.operator.children.network_policy import network_labels
from tracefleet.operator.children.security import container_security_context, pod_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.contract.podenv import HarnessEnv, ProxySidecarEnv
from tracefleet.contract import task_image as ti
from tracefleet.operator.children.task_image import (
    bundle_init_container,
    session_container,
    shared_volume,
    task_harness_container,
)
from tracefleet.operator.harbor_tasks import ClusterHarborTask

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


def session_secret() -> str:
    return "tfs_" + secrets.token_urlsafe(24)


def harness_pod(job: RolloutJob, cfg: OperatorConfig, plan: SessionPlan, attempt: int, secret: str | None = None,
                harbor: ClusterHarborTask | None = None) -> Manifest:
    """One session = one pod: the harness container plus the proxy as a native sidecar. The session's `plan`
    (tracefleet.operator.plans) goes to the session program whole.

    The sidecar is an init container with `restartPolicy: Always`: it starts (and is probed ready)
    before the harness, and the pod still completes when the harness exits. A Harbor task (`harbor`) runs
    its harness in the task's own image, the session program beside it (tracefleet.operator.children.task_image).
    """
    session = plan.index
    task, sample = n.task_sample_of(session, job.spec.tasks.samples_per_task)
    name = n.harness_pod_name(job.name, session, attempt)
    secret = secret or session_secret()
    session_id = plan.session_id
    h = job.spec.harness
    capture_mode = job.spec.inference.capture.mode
    served_model = job.spec.inference.served_model()
    proxy_args = [
        "proxy",
        "--host", "0.0.0.0",
        "--port", str(PROXY_PORT),
        "--engine", inference_service_url(job),
        "--capture-dir", CAPTURE_DIR,
        "--mode", capture_mode,
        *_exact_mode_args(job),
        *(["--served-model", served_model] if served_model else []),
        "--policy-version", str(job.spec.inference.policy_version),
        *_engine_args(job),
        "--session", f"{session_id}:{env_ref(podenv.SESSION_SECRET)}",
        # on SIGTERM (the pod stopping after the harness exits) upload capture.jsonl + the harness's
        # artifacts to the session's prefix (tracefleet.proxy.upload)
        "--upload-to", layout.session_uri(job.spec.output.uri, job.name, session),
        "--artifacts-dir", ARTIFACTS_DIR,
    ]
    proxy = {
        "name": "proxy",
        "image": cfg.proxy_image,
        "command": ["tracefleet"],
        "args": proxy_args,
        "restartPolicy": "Always",
        "env": env_vars({**ProxySidecarEnv(session_secret=secret, endpoint=cfg.bucket_endpoint).to_env(), **_tokenizer_env(job)})
        + engine_api_key_env(job, podenv.ENGINE_API_KEY),
        "envFrom": bucket_env_from(job),
        "ports": [{"name": "proxy", "containerPort": PROXY_PORT}],
        "startupProbe": {"httpGet": {"path": "/health", "port": "proxy"}, "periodSeconds": 1, "failureThreshold": 60},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "proxy"}, "periodSeconds": 5},
        "resources": proxy_resources(capture_mode, job.spec.inference.capture.proxy_resources),
        "securityContext": {**container_security_context(), "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "capture", "mountPath": CAPTURE_DIR},
            {"name": "artifacts", "mountPath": ARTIFACTS_DIR, "readOnly": True},
            {"name": "proxy-tmp", "mountPath": "/tmp"},
        ],
    }
    if (cache := _sidecar_tokenizer_cache(job)) is not None:
        proxy["volumeMounts"].append({"name": "tokenizer-cache", "mountPath": cache.mount_path, "readOnly": True})
    volumes: list[dict[str, Any]] = [
        {"name": "capture", "emptyDir": {}},
        {"name": "artifacts", "emptyDir": {}},
        {"name": "workspace", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "proxy-tmp", "emptyDir": {}},
    ]
    mounts = [
        {"name": "workspace", "mountPath": WORKSPACE_DIR},
        {"name": "home", "mountPath": HOME_DIR},
        {"name": "artifacts", "mountPath": ARTIFACTS_DIR},
    ]
    harness_mounts = [
        {"name": "workspace", "mountPath": SESSION_DIR},
        {"name": "workspace", "mountPath": plan.harness.workdir, "subPath": layout.WORKDIR},
        *mounts[1:],
    ]
    if (cache := _sidecar_tokenizer_cache(job)) is not None:
        volumes.append({"name": "tokenizer-cache",
                        "persistentVolumeClaim": {"claimName": cache.claim_name, "readOnly": True}})
    pod_env = HarnessEnv(plan=plan.model_copy(update={"attempt": attempt}), base_url=f"http://127.0.0.1:{PROXY_PORT}", api_key=secret,
                         artifacts_dir=ARTIFACTS_DIR, launch_dir=ti.LAUNCH_DIR if harbor is not None else None,
                         work_dir=SESSION_DIR if harbor is None else None)
    # The harness process takes spec.harness.env from the plan (tracefleet.runner.environment: over the preset's
    # variables); the container has it too, for the pod program's own steps (workspace setup), as before. First:
    # the pod program's own inputs (TRACEFLEET_*, HOME) are not the job's to change.
    harness_env = {**{k: str(v) for k, v in (h.env or {}).items()}, **pod_env.to_env(), "HOME": HOME_DIR}
    resources = h.resources.model_dump(mode="json", exclude_none=True) if h.resources else {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    harness = {
        "name": "harness",
        "image": h.image,
        # The runner's in-pod entrypoint: prepares the workspace, launches the preset's CLI against
        # the sidecar proxy, and writes artifacts (e.g. git diff) to /artifacts.
        "command": ["tracefleet", "run", "--in-pod"],
        "workingDir": plan.harness.workdir,
        "env": env_vars(harness_env),
        "resources": resources,
        "securityContext": container_security_context(),
        "volumeMounts": harness_mounts,
    }
    init_containers, containers = [proxy], [harness]
    if harbor is not None:
        # the task's image runs the harness; the session program runs beside it, on the pod's own inputs only
        session_env = {**pod_env.to_env(), "HOME": HOME_DIR}
        init_containers.append(bundle_init_container(job))
        containers = [task_harness_container(harbor, resources, ("home", HOME_DIR)),
                      session_container(cfg, session_env, mounts, WORKSPACE_DIR)]
        volumes.append(shared_volume())
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "activeDeadlineSeconds": h.session_timeout_seconds + SESSION_DEADLINE_GRACE_S,
        "terminationGracePeriodSeconds": 30,
        "initContainers": init_containers,
        "containers": containers,
        "volumes": volumes,
        **pod_fields(job, cfg.image_pull_secrets),
    }
    if h.runtime_class_name:
        spec["runtimeClassName"] = h.runtime_class_name
    labels = {
        n.LABEL_SESSION: str(session),
        n.LABEL_TASK: str(task),
        n.LABEL_SAMPLE: str(sample),
        n.LABEL_ATTEMPT: str(attempt),
        **network_labels(harbor, "agent"),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(job, name, n.COMPONENT_HARNESS, **labels),
        "spec": spec,
    }


def _sidecar_tokenizer_cache(job: RolloutJob) -> ModelCache | None:
    """The volume the proxy sidecar mounts read-only to read the tokenizer; None in server mode."""
    inference = job.spec.inference
    return None if inference.capture.mode == "server" else inference.capture_tokenizer_cache()


def _engine_args(job: RolloutJob) -> list[str]:
    """The proxy's engine time limits, the kind of logprobs the engine reports and the job's sampling
    (spec.inference)."""
    inference = job.spec.inference
    return (inference.engine_timeouts.limits().flags() + logprobs_mode_flags(inference.logprobs_mode())
            + inference.sampling.override().flags())


def _exact_mode_args(job: RolloutJob) -> list[str]:
    """The proxy's exact-mode flags: where to read the tokenizer (a hub id resolves in the mounted
    model cache, the layout vLLM downloads into) and the family/parser overrides."""
    inference = job.spec.inference
    cap = inference.capture
    if cap.mode == "server":
        return []
    tokenizer = inference.capture_tokenizer()
    return [*(["--model-path", tokenizer] if tokenizer else []),
            *(["--model-family", cap.model_family] if cap.model_family else []),
            *(["--tool-parser", cap.tool_parser] if cap.tool_parser else [])]


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
