"""`tracefleet run --in-pod`: one session inside a harness pod the operator created.

The operator (tracefleet.operator.children.harness.harness_pod) starts this as the harness container,
next to the proxy sidecar that already holds the session (`--session ID:SECRET`). Everything comes from
the environment it sets, read as tracefleet.contract.podenv.HarnessEnv: the task (inline, ConfigMap file or JSONL
URI), the preset and its command, spec.harness.workspace.setup, the sidecar's URL, the session secret,
the model, the session's ids and timeout, where the artifacts go.

Steps (the same lifecycle stages as local mode, tracefleet.runner.session): prepare the workspace under
the working directory, wait for the proxy, launch the preset's harness in its own process group under
the session timeout, then write the artifacts the sidecar uploads when the pod stops: session.patch
(git diff against the base commit), harness.stdout / harness.stderr, setup.log, exit_code and
result.json (tracefleet.contract.layout names them). The evaluator Job scores them later; this process never sees
bucket credentials. Exit status: 0 completed, 1 error, 124 timeout, 2 bad configuration.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracefleet.contract import layout
from tracefleet.contract.semantics import group_id, harness_preset
from tracefleet.contract.podenv import PREFIX, HarnessEnv, PodEnvError, SessionEnv
from tracefleet.runner.evaluators import EvaluatorSpec
from tracefleet.runner.sandbox import run_sandboxed
from tracefleet.runner.session import (
    HarnessConfig,
    SessionPlan,
    SessionResult,
    StageFailed,
    collect_stage,
    launch_stage,
    prepare_stage,
    wait_stage,
)
from tracefleet.runner.task import Task, task_from_api

EXIT_CODES = {"completed": 0, "error": 1, "timeout": 124, "stopped": 143}
EXIT_CONFIG = 2
PROXY_WAIT_S = 60.0
# The container's own variables that are this entrypoint's input, not the harness's business.
_NOT_FOR_HARNESS = ("HOME", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_")


def _task_line(text: str, index: int, where: str) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.strip()]
    if not 0 <= index < len(lines):
        raise PodEnvError(f"task index {index} is out of range: {where} has {len(lines)} task(s)")
    return json.loads(lines[index])


def task_from_env(env: SessionEnv, base: Path, extra_setup: list[str] | None = None) -> Task:
    """The session's task from the pod environment (harness pods and evaluator Jobs alike); `base` is
    where relative task paths start."""
    from tracefleet.contract.job import Task as ApiTask

    if env.task_json is not None:
        raw = env.task_json
    elif env.tasks_file is not None:
        raw = _task_line(Path(env.tasks_file).read_text(), env.task_index, env.tasks_file)
    else:
        from tracefleet.runner.local import _read_uri

        assert env.tasks_uri is not None  # SessionEnv.has_task was checked by the caller's model
        raw = _task_line(_read_uri(env.tasks_uri, base), env.task_index, env.tasks_uri)
    return task_from_api(ApiTask.model_validate(raw), base, extra_setup)


def job_dir(env: HarnessEnv) -> Path:
    return Path(env.job_dir or os.getcwd()).resolve()


def plan_from_env(env: HarnessEnv) -> SessionPlan:
    base = job_dir(env)
    task = task_from_env(env, base, env.workspace_setup)
    harness = HarnessConfig(
        preset=harness_preset(env.preset),
        # {job_dir}: as in local mode, a job can ship its harness script next to its tasks (in the image).
        command=[str(a).replace("{job_dir}", str(base)) for a in env.command] if env.command else None,
        timeout_s=env.timeout_s,
    )
    return SessionPlan(
        session_id=env.session_id,
        job=env.job,
        task=task,
        sample_index=env.sample_index,
        group_id=group_id(env.job, task.id),
        harness=harness,
        evaluator=EvaluatorSpec(type="none"),  # scoring is the evaluator Job's, in a fresh pod
        model=env.model or "default",
    )


def wait_for_proxy(base_url: str, timeout_s: float = PROXY_WAIT_S) -> str | None:
    """None once the proxy answers /health, else why not. The native sidecar is normally ready first;
    this only covers a slow start."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url.rstrip("/") + "/health", timeout=2).status_code == 200:
                return None
            last = "unhealthy"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    return f"proxy at {base_url} not reachable after {timeout_s:.0f}s ({last})"


def harness_env(env: Mapping[str, str]) -> dict[str, str]:
    """The container's environment (spec.harness.env is in it) minus this entrypoint's own inputs: in a
    pod the container is the sandbox, and it holds no credentials but the session secret."""
    return {k: v for k, v in env.items() if k not in _NOT_FOR_HARNESS and not k.startswith(PREFIX)}


def run_in_pod(env: Mapping[str, str], *, stop: threading.Event | None = None) -> SessionResult:
    pod = HarnessEnv.from_env(env)
    plan = plan_from_env(pod)
    artifacts = Path(pod.artifacts_dir)
    artifacts.mkdir(parents=True, exist_ok=True)
    work = Path(pod.work_dir or os.getcwd())
    home = Path(env.get("HOME") or work / "home")
    base_url = pod.base_url.rstrip("/")
    api_key = pod.api_key
    result = SessionResult.for_plan(plan, work)
    started = time.monotonic()
    deadline = started + plan.harness.timeout_s
    workspace = None
    try:
        t0 = time.monotonic()
        try:
            workspace = prepare_stage(plan, work)
        finally:
            result.timings["prepare"] = round(time.monotonic() - t0, 4)
        problem = wait_for_proxy(base_url, min(PROXY_WAIT_S, max(1.0, deadline - time.monotonic())))
        if problem:
            raise StageFailed("register", "error", problem)
        t0 = time.monotonic()
        # The session's own path prefix: the proxy then refuses this secret for any other session.
        launch = launch_stage(plan, workdir=workspace.workdir, home=home, base_url=f"{base_url}/s/{plan.session_id}",
                              api_key=api_key)
        proc = run_sandboxed(
            list(launch.argv),
            cwd=workspace.workdir,
            home=home,
            env={**harness_env(env), **launch.env},
            timeout_s=max(0.0, deadline - time.monotonic()),
            stdout_path=artifacts / layout.HARNESS_STDOUT,
            stderr_path=artifacts / layout.HARNESS_STDERR,
            stop=stop,
        )
        result.timings["harness"] = round(time.monotonic() - t0, 4)
        wait_stage(proc, plan, result, stopped="pod stopping (SIGTERM)")
        return result
    except StageFailed as failed:
        failed.record(result)
        return result
    except Exception as exc:  # noqa: BLE001 - never leave a result.json that says "completed" after a crash
        result.status, result.stage = "error", "prepare" if workspace is None else "harness"
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        _write_artifacts(result, workspace, work, artifacts)
        result.timings["total"] = round(time.monotonic() - started, 4)
        # written last and atomically: the sidecar takes its presence to mean the artifacts are complete
        tmp = artifacts / f".{layout.RESULT}.tmp"
        tmp.write_text(result.model_dump_json(indent=1))
        tmp.replace(artifacts / layout.RESULT)


def _write_artifacts(result: SessionResult, workspace: Any, work: Path, artifacts: Path) -> None:
    """What the evaluator needs, whatever happened: the diff is collected even after a timeout."""
    if (work / layout.SETUP_LOG).exists():
        shutil.copyfile(work / layout.SETUP_LOG, artifacts / layout.SETUP_LOG)
    if workspace is not None:
        t0 = time.monotonic()
        collect_stage(workspace, artifacts, result)
        result.timings["collect"] = round(time.monotonic() - t0, 4)
    (artifacts / layout.EXIT_CODE).write_text("" if result.harness_exit_code is None else f"{result.harness_exit_code}\n")


def main(env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    stop = threading.Event()
    # Pod deletion / activeDeadlineSeconds: kill the harness group, still write the artifacts.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        result = run_in_pod(env, stop=stop)
    except (PodEnvError, ValueError, OSError) as exc:
        print(f"tracefleet run --in-pod: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    summary = {"session": result.session_id, "task": result.task_id, "status": result.status, "stage": result.stage,
               "error": result.error, "harness_exit_code": result.harness_exit_code, "patch_bytes": result.patch_bytes}
    print(json.dumps(summary), flush=True)
    return EXIT_CODES.get(result.status, 1)
