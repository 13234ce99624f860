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

from kubernetes.client import (V1Capabilities, V1Container, V1EmptyDirVolumeSource, V1EnvFromSource,
                               V1ResourceRequirements, V1SecurityContext, V1Volume, V1VolumeMount)

from tracefleet.contract import podenv
from tracefleet.contract import task_image as ti
from tracefleet.contract.harbor import CONTAINER_TESTS_DIR, CONTAINER_VERIFIER_LOGS
from tracefleet.contract.job import RolloutJob
from tracefleet.operator import names as n
from tracefleet.operator.children.inputs import env_vars
from tracefleet.operator.children.plan_volume import plan_mount
from tracefleet.operator.children.security import container_security_context
from tracefleet.operator.config import OperatorConfig
from tracefleet.operator.harbor_tasks import ClusterHarborTask
from tracefleet.harbor.task_image_programs import LAUNCHER, VERIFIER
from tracefleet.contract.environment import HARDENED_PYTHON_ENV

TESTS_VOLUME = "tests"
VERIFIER_LOGS_VOLUME = "verifier-logs"
# What a root shell in a task image needs to install a package and write its files, and nothing more.
TASK_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]
SESSION_RESOURCES = V1ResourceRequirements(requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "1Gi"})
BUNDLE_RESOURCES = V1ResourceRequirements(requests={"cpu": "100m", "memory": "64Mi"}, limits={"memory": "256Mi"})


def shared_mount() -> V1VolumeMount:
    return V1VolumeMount(name=ti.SHARED_VOLUME, mount_path=ti.SHARED_DIR)


def empty_dir(name: str) -> V1Volume:
    return V1Volume(name=name, empty_dir=V1EmptyDirVolumeSource())


def shared_volume() -> V1Volume:
    return empty_dir(ti.SHARED_VOLUME)


def task_security_context(user: str | int | None) -> V1SecurityContext:
    """The task container's: Harbor's user for the phase as a uid, root by default (see the module's docstring).
    A user given by name cannot be resolved by the kubelet (it takes numbers): such a phase runs as root."""
    uid = int(user) if isinstance(user, int) or (isinstance(user, str) and user.isdigit()) else 0
    return V1SecurityContext(allow_privilege_escalation=False,
                             capabilities=V1Capabilities(drop=["ALL"], add=TASK_CAPABILITIES),
                             run_as_user=uid, run_as_non_root=uid != 0)


def task_resources(task: ClusterHarborTask, fallback: V1ResourceRequirements) -> V1ResourceRequirements:
    """task.toml's cpus, memory, storage (ephemeral-storage) and gpus (nvidia.com/gpu), requested and limited
    alike (a task states what it needs); the job's harness resources where task.toml states none."""
    quantities = {k: str(v) for k, v in task.resources.items()}  # Kubernetes quantities are strings
    return V1ResourceRequirements(requests=dict(quantities), limits=dict(quantities)) if quantities else fallback


def _workdir_env(task: ClusterHarborTask) -> dict[str, str]:
    return {podenv.TASK_WORKDIR: task.workdir} if task.workdir else {}


def bundle_init_container(job: RolloutJob) -> V1Container:
    return V1Container(name="bundle", image=job.spec.harness.image,
                       command=["sh", "-c", f"cp -a {ti.BUNDLE_SOURCE_DIR}/. {ti.BUNDLE_DIR}/"],
                       resources=BUNDLE_RESOURCES, security_context=container_security_context(),
                       volume_mounts=[shared_mount()])


def task_harness_container(task: ClusterHarborTask, fallback_resources: V1ResourceRequirements,
                           home: V1VolumeMount) -> V1Container:
    """The task image, running the launcher (tracefleet.harbor.task_image_programs.LAUNCHER)."""
    return V1Container(name="harness", image=task.image, command=["sh", "-c", LAUNCHER],
                       env=env_vars({**task.config.environment.env, **_workdir_env(task)}),
                       resources=task_resources(task, fallback_resources),
                       security_context=task_security_context(task.config.agent.user),
                       volume_mounts=[shared_mount(), home])


def session_container(cfg: OperatorConfig, harness_env: dict[str, str], mounts: list[V1VolumeMount],
                      workdir: str) -> V1Container:
    """The session program (`tracefleet run --in-pod`, its task-image place) in the tracefleet image; `harness_env`
    holds tracefleet.contract.podenv.HarnessEnv with the launch folder (spec.harness.env is in its plan)."""
    return V1Container(name="session", image=cfg.proxy_image, command=["tracefleet", "run", "--in-pod"],
                       working_dir=workdir, env=env_vars(harness_env), resources=SESSION_RESOURCES,
                       security_context=container_security_context(), volume_mounts=[*mounts, shared_mount()])


def pod_program(name: str, image: str, args: list[str], env: dict[str, str], env_from: list[V1EnvFromSource],
                resources: V1ResourceRequirements, mounts: list[V1VolumeMount] | None = None,
                security: V1SecurityContext | None = None) -> V1Container:
    """A pod program of a Job (`python -m tracefleet.runner.pod ARGS`: tracefleet.operator.names.POD_PROGRAMS)."""
    return V1Container(name=name, image=image, command=["python", "-m", n.POD_PROGRAMS, *args], env=env_vars(env),
                       env_from=env_from, resources=resources, security_context=security, volume_mounts=mounts)


def _verify_container(task: ClusterHarborTask, fallback_resources: V1ResourceRequirements) -> V1Container:
    """tests/test.sh in a fresh container of the task's image, the agent's change set applied first."""
    verifier = task.config.verifier
    env = {**task.config.environment.env, **verifier.env, **HARDENED_PYTHON_ENV, **_workdir_env(task),
           podenv.VERIFIER_TIMEOUT_S: str(task.verifier_timeout_s),
           **({ti.VERIFIER_USER_ENV: str(verifier.user)} if verifier.user is not None else {})}
    return V1Container(name="verify", image=task.image, command=["sh", "-c", VERIFIER], env=env_vars(env),
                       resources=task_resources(task, fallback_resources),
                       # root applies the change set (the agent may have written anywhere); test.sh runs as [verifier].user
                       security_context=task_security_context(None),
                       volume_mounts=[shared_mount(), V1VolumeMount(name=TESTS_VOLUME, mount_path=CONTAINER_TESTS_DIR),
                                      V1VolumeMount(name=VERIFIER_LOGS_VOLUME, mount_path=CONTAINER_VERIFIER_LOGS)])


def verifier_steps(cfg: OperatorConfig, task: ClusterHarborTask, eval_env: dict[str, str],
                   bucket_env_from: list[V1EnvFromSource], fallback_resources: V1ResourceRequirements
                   ) -> tuple[list[V1Container], V1Container, list[V1Volume]]:
    """(init containers: fetch then verify, the report container, volumes) of a Harbor task's evaluator Job
    (tracefleet.runner.pod.harbor_verifier); the fetch and report steps read the plan (children.plan_volume). /tests and
    /logs/verifier are emptyDirs of their own: fresh for every run, whatever the change set holds there."""
    fetch = pod_program("fetch", cfg.proxy_image, ["harbor-fetch", ti.EVAL_DIR], eval_env, bucket_env_from,
                        SESSION_RESOURCES, [shared_mount(), plan_mount()], container_security_context())
    # and the plan, as every Job's container (children.jobs)
    report = pod_program("evaluator", cfg.proxy_image, ["harbor-report", ti.EVAL_DIR, ti.VERIFIER_LOGS_DIR], eval_env,
                         bucket_env_from, SESSION_RESOURCES,
                         [shared_mount(), V1VolumeMount(name=VERIFIER_LOGS_VOLUME, mount_path=ti.VERIFIER_LOGS_DIR,
                                                        read_only=True)])
    volumes = [shared_volume(), empty_dir(TESTS_VOLUME), empty_dir(VERIFIER_LOGS_VOLUME)]
    return [fetch, _verify_container(task, fallback_resources)], report, volumes
