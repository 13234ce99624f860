"""`tracefleet run --in-pod`: one session inside a harness pod the operator created.

The operator (tracefleet.operator.children.harness_pod) starts this as the harness container, next
to the proxy sidecar that already holds the session (`--session ID:SECRET`). Everything comes from
the environment it sets:

    TRACEFLEET_TASK_JSON | TRACEFLEET_TASKS_FILE | TRACEFLEET_TASKS_URI   the task (inline / ConfigMap / JSONL URI;
                                       the latter two pick line TRACEFLEET_TASK_INDEX)
    TRACEFLEET_PRESET, TRACEFLEET_COMMAND_JSON   the harness preset and, for `command`, its argv
    TRACEFLEET_WORKSPACE_SETUP_JSON (optional)   spec.harness.workspace.setup: shell commands run after the
                                       task's own setup, before the harness starts
    TRACEFLEET_BASE_URL, TRACEFLEET_API_KEY, TRACEFLEET_MODEL   the sidecar proxy, the session secret, the model
    TRACEFLEET_SESSION_ID, TRACEFLEET_JOB, TRACEFLEET_SAMPLE_INDEX, TRACEFLEET_TIMEOUT_S, TRACEFLEET_ARTIFACTS_DIR
    TRACEFLEET_JOB_DIR (optional; default: the working directory)   base of relative task paths and `{job_dir}`

Steps (the same functions as local mode, tracefleet.runner.session / workspace / sandbox): prepare the
workspace under the working directory, wait for the proxy, launch the preset's harness in its own
process group under the session timeout, then write the artifacts the sidecar uploads when the pod
stops: session.patch (git diff against the base commit), harness.stdout / harness.stderr,
setup.log, exit_code and result.json. The evaluator Job scores them later; this process never sees
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

from tracefleet.runner.evaluators import EvaluatorSpec
from tracefleet.runner.sandbox import run_sandboxed
from tracefleet.runner.session import HarnessConfig, SessionPlan, SessionResult, harness_launch
from tracefleet.runner.task import Task, task_from_api
from tracefleet.runner.workspace import WorkspaceError, prepare_workspace, workspace_patch

EXIT_CODES = {"completed": 0, "error": 1, "timeout": 124, "stopped": 143}
EXIT_CONFIG = 2
PROXY_WAIT_S = 60.0
# The container's own variables that are this entrypoint's input, not the harness's business.
_NOT_FOR_HARNESS = ("HOME", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_")


class PodConfigError(ValueError):
    """The pod's environment is incomplete or inconsistent: a problem of the manifest, not the session."""


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise PodConfigError(f"{name} is not set (the operator sets it on the harness container)")
    return value


def job_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("TRACEFLEET_JOB_DIR") or os.getcwd()).resolve()


def _task_line(text: str, index: int, where: str) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.strip()]
    if not 0 <= index < len(lines):
        raise PodConfigError(f"task index {index} is out of range: {where} has {len(lines)} task(s)")
    return json.loads(lines[index])


def task_from_env(env: Mapping[str, str]) -> Task:
    """The session's task from the pod environment (harness pods and evaluator Jobs alike)."""
    from tracefleet.api.model import Task as ApiTask

    if env.get("TRACEFLEET_TASK_JSON"):
        raw = json.loads(env["TRACEFLEET_TASK_JSON"])
    elif env.get("TRACEFLEET_TASKS_FILE"):
        path = Path(env["TRACEFLEET_TASKS_FILE"])
        raw = _task_line(path.read_text(), int(_required(env, "TRACEFLEET_TASK_INDEX")), str(path))
    elif env.get("TRACEFLEET_TASKS_URI"):
        from tracefleet.runner.local import _read_uri

        uri = env["TRACEFLEET_TASKS_URI"]
        raw = _task_line(_read_uri(uri, job_dir(env)), int(_required(env, "TRACEFLEET_TASK_INDEX")), uri)
    else:
        raise PodConfigError("no task: set TRACEFLEET_TASK_JSON, TRACEFLEET_TASKS_FILE or TRACEFLEET_TASKS_URI")
    extra_setup = json.loads(env["TRACEFLEET_WORKSPACE_SETUP_JSON"]) if env.get("TRACEFLEET_WORKSPACE_SETUP_JSON") else None
    return task_from_api(ApiTask.model_validate(raw), job_dir(env), extra_setup)


def plan_from_env(env: Mapping[str, str]) -> SessionPlan:
    task = task_from_env(env)
    job = _required(env, "TRACEFLEET_JOB")
    command = json.loads(env["TRACEFLEET_COMMAND_JSON"]) if env.get("TRACEFLEET_COMMAND_JSON") else None
    base = str(job_dir(env))
    harness = HarnessConfig(
        preset=env.get("TRACEFLEET_PRESET") or "command",
        # {job_dir}: as in local mode, a job can ship its harness script next to its tasks (in the image).
        command=[str(a).replace("{job_dir}", base) for a in command] if command else None,
        timeout_s=float(env.get("TRACEFLEET_TIMEOUT_S") or 1800),
    )
    return SessionPlan(
        session_id=env.get("TRACEFLEET_SESSION_ID") or f"{job}-s{env.get('TRACEFLEET_SESSION', '0')}",
        job=job,
        task=task,
        sample_index=int(env.get("TRACEFLEET_SAMPLE_INDEX") or 0),
        group_id=f"{job}/{task.id}",
        harness=harness,
        evaluator=EvaluatorSpec(type="none"),  # scoring is the evaluator Job's, in a fresh pod
        model=env.get("TRACEFLEET_MODEL") or "default",
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
    return {k: v for k, v in env.items() if k not in _NOT_FOR_HARNESS and not k.startswith("TRACEFLEET_")}


def run_in_pod(env: Mapping[str, str], *, stop: threading.Event | None = None) -> SessionResult:
    plan = plan_from_env(env)
    artifacts = Path(env.get("TRACEFLEET_ARTIFACTS_DIR") or "/artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    work = Path(env.get("TRACEFLEET_WORK_DIR") or os.getcwd())
    home = Path(env.get("HOME") or work / "home")
    base_url = _required(env, "TRACEFLEET_BASE_URL").rstrip("/")
    api_key = _required(env, "TRACEFLEET_API_KEY")
    result = SessionResult(session_id=plan.session_id, job=plan.job, task_id=plan.task.id, sample_index=plan.sample_index,
                           group_id=plan.group_id, session_dir=str(work))
    started = time.monotonic()
    deadline = started + plan.harness.timeout_s
    workspace = None
    try:
        t0 = time.monotonic()
        try:
            workspace = prepare_workspace(plan.task, work, setup_timeout_s=plan.setup_timeout_s)
        except WorkspaceError as exc:
            result.status = "timeout" if "timed out" in str(exc) else "error"
            result.stage, result.error = "prepare", str(exc)
            return result
        finally:
            result.timings["prepare"] = round(time.monotonic() - t0, 4)
        problem = wait_for_proxy(base_url, min(PROXY_WAIT_S, max(1.0, deadline - time.monotonic())))
        if problem:
            result.status, result.stage, result.error = "error", "register", problem
            return result
        t0 = time.monotonic()
        # The session's own path prefix: the proxy then refuses this secret for any other session.
        session_url = f"{base_url}/s/{plan.session_id}"
        try:
            launch = harness_launch(plan, workdir=workspace.workdir, home=home, base_url=session_url, api_key=api_key)
            for rel, content in launch.files.items():
                target = home / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
        except Exception as exc:  # noqa: BLE001 - a preset that cannot launch is this session's error
            result.status, result.stage = "error", "harness"
            result.error = f"preset {plan.harness.preset}: {type(exc).__name__}: {exc}"
            return result
        proc = run_sandboxed(
            list(launch.argv),
            cwd=workspace.workdir,
            home=home,
            env={**harness_env(env), **launch.env},
            timeout_s=max(0.0, deadline - time.monotonic()),
            stdout_path=artifacts / "harness.stdout",
            stderr_path=artifacts / "harness.stderr",
            stop=stop,
        )
        result.timings["harness"] = round(time.monotonic() - t0, 4)
        result.harness_exit_code = proc.exit_code
        if proc.start_error:
            result.status, result.stage, result.error = "error", "harness", f"harness did not start: {proc.start_error}"
        elif proc.stopped:
            result.status, result.stage, result.error = "stopped", "harness", "pod stopping (SIGTERM)"
        elif proc.timed_out:
            result.status, result.stage = "timeout", "harness"
            result.error = f"harness ran past {plan.harness.timeout_s:.0f}s; process group killed"
        elif proc.exit_code != 0:
            result.status, result.stage, result.error = "error", "harness", f"harness exited {proc.exit_code}"
        return result
    except Exception as exc:  # noqa: BLE001 - never leave a result.json that says "completed" after a crash
        result.status, result.stage = "error", "prepare" if workspace is None else "harness"
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        _write_artifacts(result, workspace, work, artifacts)
        result.timings["total"] = round(time.monotonic() - started, 4)
        # written last and atomically: the sidecar takes its presence to mean the artifacts are complete
        tmp = artifacts / ".result.json.tmp"
        tmp.write_text(result.model_dump_json(indent=1))
        tmp.replace(artifacts / "result.json")


def _write_artifacts(result: SessionResult, workspace: Any, work: Path, artifacts: Path) -> None:
    """What the evaluator needs, whatever happened: the diff is collected even after a timeout."""
    if (work / "setup.log").exists():
        shutil.copyfile(work / "setup.log", artifacts / "setup.log")
    if workspace is not None:
        t0 = time.monotonic()
        try:
            patch = workspace_patch(workspace.workdir, workspace.base_commit)
            (artifacts / "session.patch").write_text(patch)
            result.patch_bytes = len(patch.encode())
        except Exception as exc:  # noqa: BLE001
            if result.status == "completed":
                result.status, result.stage = "error", "collect"
            result.error = "; ".join(filter(None, [result.error, f"git diff of the workspace failed: {exc}"]))
        result.timings["collect"] = round(time.monotonic() - t0, 4)
    (artifacts / "exit_code").write_text("" if result.harness_exit_code is None else f"{result.harness_exit_code}\n")


def main(env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    stop = threading.Event()
    # Pod deletion / activeDeadlineSeconds: kill the harness group, still write the artifacts.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        result = run_in_pod(env, stop=stop)
    except (PodConfigError, ValueError, OSError) as exc:
        print(f"tracefleet run --in-pod: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    summary = {"session": result.session_id, "task": result.task_id, "status": result.status, "stage": result.stage,
               "error": result.error, "harness_exit_code": result.harness_exit_code, "patch_bytes": result.patch_bytes}
    print(json.dumps(summary), flush=True)
    return EXIT_CODES.get(result.status, 1)
