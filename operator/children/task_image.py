"""The containers of a Harbor task's pods: the task's own image for the harness and the verifier, the tracefleet
image beside it for the session program and the verdict, the harness bundle by an init container.

How the harness CLI arrives without being baked into the task image: an init container of the bundle image
(spec.harness.image) copies its BUNDLE_SOURCE_DIR into the pod's shared emptyDir, mounted in the task container,
whose launch request puts the bundle's bin/ first on PATH (tracefleet.contract.task_image has the layout). Chosen
over an image volume (a pod volume backed by an OCI image, KEP-4639): image volumes are beta and off by default
until Kubernetes 1.33 and need a container runtime that supports them (containerd 2.1+, CRI-O 1.31+), so a job
would run on some clusters and not others; an init container runs on every cluster and every runtime, the bundle
image is pulled and cached by the node like any image, and the copy of a harness bundle (a Node.js runtime and one
CLI, ~100-200 MB) costs a second or two of a session that runs minutes. The bundle must be self-contained (its own
runtime: the task image has none) and the bundle image needs `sh` and `cp`.

Who runs as whom: the task container runs as task.toml's [agent].user, root when it names none (the verifier's
applies the agent's change set as root and runs test.sh as [verifier].user, by name or number), as Harbor runs
tasks (a Harbor task's files belong to root and its instruction may need a package installed): with no privilege escalation, capabilities cut to what a root shell installing packages needs,
the pod's seccomp profile, and no service-account token. Run these pods under a sandboxing runtime
(spec.harness.runtimeClassName, e.g. gVisor) where agents are not trusted. The session program, the proxy and the
evaluator's fetch and report steps stay non-root, as in every harness pod.
"""

from __future__ import annotations

from typing import Any

from tracefleet.contract import podenv
from tracefleet.contract import task_image as ti
from tracefleet.contract.harbor import CONTAINER_TESTS_DIR, CONTAINER_VERIFIER_LOGS
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.inputs import env_vars
from tracefleet.operator.children.plan_volume import PLAN_MOUNT
from tracefleet.operator.children.security import container_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import ClusterHarborTask
from tracefleet.harbor.task_image_programs import LAUNCHER, VERIFIER
from tracefleet.contract.environment import HARDENED_PYTHON_ENV

SHARED_MOUNT = {"name": ti.SHARED_VOLUME, "mountPath": ti.SHARED_DIR}
TESTS_VOLUME = "tests"
VERIFIER_LOGS_VOLUME = "verifier-logs"
# What a root shell in a task image needs to install a package and write its files, and nothing more.
TASK_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]
SESSION_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
BUNDLE_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def shared_volume() -> dict[str, Any]:
    return {"name": ti.SHARED_VOLUME, "emptyDir": {}}


def task_security_context(user: str | int | None) -> dict[str, Any]:
    """The task container's: Harbor's user for the phase as a uid, root by default (see the module's docstring).
    A user given by name cannot be resolved by the kubelet (it takes numbers): such a phase runs as root."""
    uid = int(user) if isinstance(user, int) or (isinstance(user, str) and user.isdigit()) else 0
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": TASK_CAPABILITIES},
            "runAsUser": uid, "runAsNonRoot": uid != 0}


def task_resources(task: ClusterHarborTask, fallback: dict[str, Any]) -> dict[str, Any]:
    """task.toml's cpus, memory, storage (ephemeral-storage) and gpus (nvidia.com/gpu), requested and limited
    alike (a task states what it needs); the job's harness resources where task.toml states none."""
    quantities = {k: str(v) for k, v in task.resources.items()}  # Kubernetes quantities are strings
    return {"requests": dict(quantities), "limits": dict(quantities)} if quantities else fallback


def _workdir_env(task: ClusterHarborTask) -> dict[str, str]:
    return {podenv.TASK_WORKDIR: task.workdir} if task.workdir else {}


def bundle_init_container(job: RolloutJob) -> dict[str, Any]:
    return {
        "name": "bundle",
        "image": job.spec.harness.image,
        "command": ["sh", "-c", f"cp -a {ti.BUNDLE_SOURCE_DIR}/. {ti.BUNDLE_DIR}/"],
        "resources": BUNDLE_RESOURCES,
        "securityContext": container_security_context(),
        "volumeMounts": [SHARED_MOUNT],
    }


def task_harness_container(task: ClusterHarborTask, fallback_resources: dict[str, Any], home: tuple[str, str]) -> dict[str, Any]:
    """The task image, running the launcher (tracefleet.harbor.task_image_programs.LAUNCHER)."""
    env = {**task.config.environment.env, **_workdir_env(task)}
    return {
        "name": "harness",
        "image": task.image,
        "command": ["sh", "-c", LAUNCHER],
        "env": env_vars(env),
        "resources": task_resources(task, fallback_resources),
        "securityContext": task_security_context(task.config.agent.user),
        "volumeMounts": [SHARED_MOUNT, {"name": home[0], "mountPath": home[1]}],
    }


def session_container(cfg: OperatorConfig, harness_env: dict[str, str], mounts: list[dict[str, Any]],
                      workdir: str) -> dict[str, Any]:
    """The session program (`tracefleet run --in-pod`, its task-image place) in the tracefleet image; `harness_env`
    holds tracefleet.contract.podenv.HarnessEnv with the launch folder (spec.harness.env is in its plan)."""
    return {
        "name": "session",
        "image": cfg.proxy_image,
        "command": ["tracefleet", "run", "--in-pod"],
        "workingDir": workdir,
        "env": env_vars(harness_env),
        "resources": SESSION_RESOURCES,
        "securityContext": container_security_context(),
        "volumeMounts": [*mounts, SHARED_MOUNT],
    }


def verifier_steps(cfg: OperatorConfig, task: ClusterHarborTask, eval_env: dict[str, str],
                   bucket_env_from: list[dict[str, Any]], fallback_resources: dict[str, Any]
                   ) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(init containers: fetch then verify, the report container, volumes) of a Harbor task's evaluator Job
    (tracefleet.runner.pod.harbor_verifier); the fetch and report steps read the plan (children.plan_volume). /tests and /logs/verifier are emptyDirs of their own: fresh for every
    run, whatever the change set holds there."""
    steps_security = container_security_context()
    fetch = {
        "name": "fetch",
        "image": cfg.proxy_image,
        "command": ["python", "-m", n.POD_PROGRAMS, "harbor-fetch", ti.EVAL_DIR],
        "env": env_vars(eval_env),
        "envFrom": bucket_env_from,
        "resources": SESSION_RESOURCES,
        "securityContext": steps_security,
        "volumeMounts": [SHARED_MOUNT, PLAN_MOUNT],
    }
    verifier = task.config.verifier
    env = {**task.config.environment.env, **verifier.env, **HARDENED_PYTHON_ENV, **_workdir_env(task),
           podenv.VERIFIER_TIMEOUT_S: str(task.verifier_timeout_s),
           **({ti.VERIFIER_USER_ENV: str(verifier.user)} if verifier.user is not None else {})}
    verify = {
        "name": "verify",
        "image": task.image,
        "command": ["sh", "-c", VERIFIER],
        "env": env_vars(env),
        "resources": task_resources(task, fallback_resources),
        # root applies the change set (the agent may have written anywhere); test.sh runs as [verifier].user
        "securityContext": task_security_context(None),
        "volumeMounts": [SHARED_MOUNT, {"name": TESTS_VOLUME, "mountPath": CONTAINER_TESTS_DIR},
                         {"name": VERIFIER_LOGS_VOLUME, "mountPath": CONTAINER_VERIFIER_LOGS}],
    }
    report = {
        "name": "evaluator",
        "image": cfg.proxy_image,
        "command": ["python", "-m", n.POD_PROGRAMS, "harbor-report", ti.EVAL_DIR, ti.VERIFIER_LOGS_DIR],
        "env": env_vars(eval_env),
        "envFrom": bucket_env_from,
        "resources": SESSION_RESOURCES,
        # and the plan, as every Job's container (children.jobs)
        "volumeMounts": [SHARED_MOUNT, {"name": VERIFIER_LOGS_VOLUME, "mountPath": ti.VERIFIER_LOGS_DIR,
                                        "readOnly": True}],
    }
    volumes = [shared_volume(), {"name": TESTS_VOLUME, "emptyDir": {}}, {"name": VERIFIER_LOGS_VOLUME, "emptyDir": {}}]
    return [fetch, verify], report, volumes
