"""The place of one session inside a harness pod the operator created (`tracefleet run --in-pod`:
tracefleet.runner.pod.in_pod).

The operator (tracefleet.operator.children.harness.harness_pod) starts the program as the harness container,
next to the proxy sidecar that already holds the session (its plan names it). Everything comes from what the
operator gives the container, read as tracefleet.contract.podenv.HarnessEnv: the session's plan, whole (as the
operator planned it with tracefleet.contract.plan.plan_sessions, in files; settled here at TRACEFLEET_JOB_DIR), and
the place's own inputs: the sidecar's URL, the session secret, where the artifacts go.

The session program (tracefleet.runner.session.run) in the place `PodPlace`: the workspace prepared under
the working directory, the proxy sidecar as the endpoint (connect waits for it), the harness in its own
process group under the session timeout, its outputs in the artifacts folder the sidecar uploads when the
pod stops: session.patch, harness.stdout / harness.stderr, setup.log, exit_code and result.json (written
last; tracefleet.contract.layout names them). The evaluator Job judges them later; this process never sees bucket
credentials.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from tracefleet.contract import layout
from tracefleet.contract.podenv import HarnessEnv
from tracefleet.contract.session import SessionPlan, SessionResult
from tracefleet.runner.environment import SessionEndpoint, user_env
from tracefleet.runner.sandbox import ProcessResult, run_sandboxed
from tracefleet.runner.session import SessionFolders, StageFailed

PROXY_WAIT_S = 60.0


def job_dir(env: HarnessEnv) -> Path:
    """Where the plan is settled: relative task paths and `{job_dir}` (SessionPlan.at)."""
    return Path(env.job_dir or os.getcwd()).resolve()


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


class PodPlace:
    """A harness pod: the proxy sidecar already holds the session (`--session ID:SECRET`) and uploads its
    capture and the artifacts folder when the pod stops; the container is the sandbox. Not judged here."""

    judges = False
    stopped_reason = "pod stopping (SIGTERM)"

    def __init__(self, env: Mapping[str, str], stop: threading.Event | None = None) -> None:
        self.env, self.stop = dict(env), stop
        self.pod = HarnessEnv.from_env(self.env)
        self.plan = self.pod.plan.at(job_dir(self.pod))
        work = Path(self.pod.work_dir or os.getcwd())
        self._folders = SessionFolders(work=work, artifacts=Path(self.pod.artifacts_dir),
                                       home=Path(self.env.get("HOME") or work / "home"))

    def folders(self, plan: SessionPlan) -> SessionFolders:
        return self._folders

    def connect(self, plan: SessionPlan, deadline: float) -> SessionEndpoint:
        if plan.guided_calls:
            raise StageFailed("register", "error", f"the plan guides the first {plan.guided_calls} calls, but a harness "
                              "pod's proxy sidecar has no guide engine (guided sessions run on the local driver)")
        base_url = self.pod.base_url.rstrip("/")
        problem = wait_for_proxy(base_url, min(PROXY_WAIT_S, max(1.0, deadline - time.monotonic())))
        if problem:
            raise StageFailed("register", "error", problem)
        # The session's own path prefix: the proxy then refuses this secret for any other session.
        return SessionEndpoint(base_url=f"{base_url}/s/{plan.session_id}", api_key=self.pod.api_key)

    def user_env(self, plan: SessionPlan) -> dict[str, str]:
        # the image's own variables, then spec.harness.env from the plan (the container has them too)
        return {**user_env(self.env), **plan.harness.env}

    def harness_workdir(self, plan: SessionPlan, workspace: Path) -> Path:
        """spec.harness.workspace.workdir, where the operator binds the workspace's copy
        (tracefleet.operator.children.harness); the copy's own folder where nothing is bound there."""
        seen = Path(plan.harness.workdir)
        return seen if seen.is_dir() and seen.samefile(workspace) else workspace

    def run(self, plan: SessionPlan, argv: list[str], *, cwd: Path, home: Path, env: dict[str, str], timeout_s: float,
            stdout_path: Path, stderr_path: Path) -> ProcessResult:
        return run_sandboxed(argv, cwd=self.harness_workdir(plan, cwd), home=home, env=env, timeout_s=timeout_s,
                             stdout_path=stdout_path, stderr_path=stderr_path, stop=self.stop)

    def disconnect(self, plan: SessionPlan, result: SessionResult) -> None:
        """Nothing to do: the sidecar closes the capture and uploads it when the pod stops."""

    def finish(self, result: SessionResult, folders: SessionFolders) -> None:
        """What the evaluator needs, then result.json, written last and atomically: the sidecar takes its
        presence to mean the artifacts are complete."""
        if (folders.work / layout.SETUP_LOG).exists() and folders.work != folders.artifacts:
            shutil.copyfile(folders.work / layout.SETUP_LOG, folders.artifacts / layout.SETUP_LOG)
        code = result.harness_exit_code
        (folders.artifacts / layout.EXIT_CODE).write_text("" if code is None else f"{code}\n")
        tmp = folders.artifacts / f".{layout.RESULT}.tmp"
        tmp.write_text(result.model_dump_json(indent=1))
        tmp.replace(folders.artifacts / layout.RESULT)
