"""One session, end to end: the one session program, whichever place it runs in.

Lifecycle (`run`): prepare the workspace → connect to the proxy session → launch the preset's harness
(argv, env, HOME files) in its own process group under the session timeout (kill the group) →
disconnect (the capture log closed) → collect (the workspace's diff, after any outcome) → evaluate →
evidence and traces → result.json. Every stage is timed. The result says `completed`, `timeout` (with
the stage that ran out of time), `error` (with the stage that failed) or `stopped`. Whatever happens,
the proxy session is closed and the diff collected: nothing the harness did is lost, and a failed
session's traces are kept, fail-closed (design invariant 4).

A `Place` is where the session runs; the program asks it only for:

    folders(plan)            where the workspace, the harness's outputs and its HOME go
    connect(plan)            the proxy session the harness talks to (SessionEndpoint); StageFailed("register")
    user_env(plan)           spec.harness.env as it reaches this place
    harness_workdir(plan, ws) where the harness works, as its preset is told (the job's workdir, bound there)
    run(plan, argv, ...)     the harness process, to its end, its timeout or the place's stop
    disconnect(plan, result) close the proxy session, record its calls and capture on the result
    judges                   whether evaluate/evidence/build run here, or later where the place's uploads go
    finish(result, folders)  write result.json where this place's readers look

    HostPlace (here)                 the in-process proxy, an optional loopback-only net namespace; judges
    PodPlace (runner.pod.harness_pod) the proxy sidecar, artifacts uploaded by it; the evaluator Job judges
                                     (runner.pod.evaluator_job) and the sealer builds (runner.pod.sealer_job), with
                                     `judge` / `evidence_of` / tracing.outcome_of below, as here
    ContainerPlace                   a Harbor task's own image (runner.containers.place): HostPlace, with
                                     `run` wrapping the argv in `podman run` of the task's image (HOME and
                                     the harness CLI mounted, the proxy the only endpoint it reaches),
                                     its `harness_workdir` the container's working directory and
                                     `workspace_diff` its changes against the image's

The harness's environment follows one rule (tracefleet.runner.environment): sandbox base < preset
defaults < spec.harness.env < the session's routing (proxy URL, secret, HOME).
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Iterator, Protocol

from tracefleet.contract import layout
from tracefleet.contract.session import (
    EvalOutcome,
    HarnessConfig,
    SessionPlan,
    SessionResult,
    SessionStatus,
    Stage,
    Task,
    evaluator_fingerprint,
)
from tracefleet.contract.semantics import JUDGE_ATTEMPTS
from tracefleet.diagnostics.evidence import HarnessEvidence, SessionEvidence, read_tail, session_evidence
from tracefleet.runner.environment import SessionEndpoint, harness_environment
from tracefleet.runner.evaluators import EvalContext, get_evaluator
from tracefleet.runner.failures import HARNESS_EXITED, harness_reason
from tracefleet.runner.proxy_admin import ProxyAdmin
from tracefleet.runner.sandbox import ProcessResult, SandboxOptions, run_sandboxed, workdir_view_available
from tracefleet.runner.presets.base import HarnessLaunch
from tracefleet.runner.workspace import PreparedWorkspace, WorkspaceError, prepare_workspace, workspace_patch

if TYPE_CHECKING:
    from tracefleet.traces.schema import Trace

REJUDGE_PAUSE_S = 1.0  # before judging again a session whose judging was unavailable (a runtime hiccup passes)

# the models moved to the contract floor; these names stay importable from here
__all__ = ["HarnessConfig", "SessionPlan", "SessionResult", "SessionRun", "Place", "HostPlace", "run", "run_session"]


@dataclass
class SessionRun:
    result: SessionResult
    traces: list[Trace] = field(default_factory=list)  # built traces, ready for sealing
    evidence: SessionEvidence | None = None  # what the diagnostics read (tracefleet.diagnostics)


@dataclass(frozen=True)
class SessionFolders:
    work: Path  # the workspace is prepared here
    artifacts: Path  # the harness's outputs (stdout, stderr, session.patch, result.json)
    home: Path  # the harness's HOME


class StageFailed(Exception):
    """A lifecycle stage ended the session: which stage, with what status."""

    def __init__(self, stage: Stage, status: SessionStatus, message: str) -> None:
        super().__init__(message)
        self.stage, self.status = stage, status

    def record(self, result: SessionResult) -> None:
        result.status, result.stage, result.error = self.status, self.stage, str(self)


class Place(Protocol):
    judges: bool
    stopped_reason: str  # the session's error when the place stopped it

    def folders(self, plan: SessionPlan) -> SessionFolders: ...

    def connect(self, plan: SessionPlan, deadline: float) -> SessionEndpoint: ...

    def user_env(self, plan: SessionPlan) -> dict[str, str]: ...

    def harness_workdir(self, plan: SessionPlan, workspace: Path) -> Path:
        """Where the harness works, as the preset is told: the job's workdir, where the place binds the prepared
        `workspace` there; a container's own working directory; else `workspace` itself."""
        ...

    def run(self, plan: SessionPlan, argv: list[str], *, cwd: Path, home: Path, env: dict[str, str], timeout_s: float,
            stdout_path: Path, stderr_path: Path) -> ProcessResult: ...

    def disconnect(self, plan: SessionPlan, result: SessionResult) -> None: ...

    def finish(self, result: SessionResult, folders: SessionFolders) -> None: ...


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        timings[stage] = round(time.monotonic() - started, 4)


STDIN_SHELL = ("/bin/sh", "-c")


def harness_argv(launch: HarnessLaunch) -> list[str]:
    """The launch's argv, its standard input redirected from its `stdin_file` when it has one: by a shell in front of
    it, so that every place (this machine, a container, a pod, a task image) runs it the same way, from HOME there."""
    if launch.stdin_file is None:
        return list(launch.argv)
    return [*STDIN_SHELL, f'exec "$@" < "$HOME/{launch.stdin_file}"', "sh", *launch.argv]


def harness_program(argv: list[str]) -> str:
    """The harness's own program in an argv harness_argv made (the one after the shell, when there is one)."""
    return argv[4] if argv[:2] == list(STDIN_SHELL) else argv[0]


# ---- the stages


def prepare_stage(plan: SessionPlan, work: Path) -> PreparedWorkspace:
    """The session's workspace (the task's repository, set up). A task refused before the run (a Harbor folder with
    a problem, an image that did not build) fails here with its one line."""
    if plan.task.harbor is not None and plan.task.harbor.refusal:
        raise StageFailed("prepare", "error", plan.task.harbor.refusal)
    try:
        return prepare_workspace(plan.task, work, setup_timeout_s=plan.setup_timeout_s)
    except WorkspaceError as exc:
        raise StageFailed("prepare", "timeout" if "timed out" in str(exc) else "error", str(exc)) from exc


def launch_stage(plan: SessionPlan, *, workdir: Path, home: Path, endpoint: SessionEndpoint) -> HarnessLaunch:
    """The preset's launch, its HOME files written."""
    from tracefleet.runner.presets import harness_launch

    try:
        launch = harness_launch(plan.harness, prompt=plan.task.prompt, workdir=workdir, home=home,
                                base_url=endpoint.base_url, api_key=endpoint.api_key, model=plan.model)
        for rel, content in launch.files.items():
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    except Exception as exc:  # noqa: BLE001 - a preset that cannot launch is this session's error
        raise StageFailed("harness", "error", f"preset {plan.harness.preset}: {type(exc).__name__}: {exc}") from exc
    return launch


def wait_stage(proc: ProcessResult, plan: SessionPlan, result: SessionResult, *, stopped: str,
               logs: Path | None = None) -> None:
    """How the harness process ended, as the session's outcome."""
    result.harness_exit_code = proc.exit_code
    if proc.start_error:
        raise StageFailed("harness", "error", f"harness did not start: {proc.start_error}")
    if proc.stopped:
        raise StageFailed("harness", "stopped", stopped)
    if proc.timed_out:
        raise StageFailed("harness", "timeout", f"harness ran past {plan.harness.timeout_s:.0f}s; process group killed")
    if proc.exit_code != 0:
        # with the harness's own last words (its stdout and stderr are in `logs`): what a person reads first
        reason = harness_reason(logs) if logs is not None else None
        raise StageFailed("harness", "error", f"{HARNESS_EXITED}{proc.exit_code}" + (f": {reason}" if reason else ""))


def collect_stage(workspace: PreparedWorkspace, dest: Path, result: SessionResult,
                  diff: Callable[[], str] | None = None) -> str:
    """The workspace's diff against its base commit, written to dest/session.patch (after any outcome:
    nothing the harness did is lost). `diff`: the place's own (a container's working directory against its
    image's), when the harness worked elsewhere than in `workspace`."""
    try:
        patch = diff() if diff is not None else workspace_patch(workspace.workdir, workspace.base_commit)
        (dest / layout.PATCH).write_text(patch)
    except Exception as exc:  # noqa: BLE001
        result.fail("collect", "error", f"git diff of the workspace failed: {exc}")
        return ""
    result.patch_bytes = len(patch.encode())
    return patch


def judge(plan: SessionPlan, ctx: EvalContext) -> EvalOutcome:
    """The plan's evaluator on a finished session (here, or in the evaluator Job); never raises. A judging that
    reports `unavailable` (it could not run or report: tracefleet.contract.semantics) is run again over the same
    patch, JUDGE_ATTEMPTS in all, REJUDGE_PAUSE_S apart; the last verdict says how many ran (`details.attempts`) and
    which evaluator judged (`details.evaluator_spec`, tracefleet.contract.session.evaluator_fingerprint)."""
    asked = judged_by(plan)
    try:
        evaluator = get_evaluator(plan.evaluator)
    except Exception as exc:  # noqa: BLE001 - an evaluator that cannot be built judges nothing the agent did
        return EvalOutcome(status="unavailable", message=f"{type(exc).__name__}: {exc}", details=asked)
    for attempt in range(1, JUDGE_ATTEMPTS + 1):
        outcome = evaluator.evaluate(ctx)
        if outcome.status != "unavailable" or attempt == JUDGE_ATTEMPTS:
            break
        time.sleep(REJUDGE_PAUSE_S)
    if attempt > 1:
        outcome.details["attempts"] = attempt
    outcome.details.update(asked)
    return outcome


def judged_by(plan: SessionPlan) -> dict[str, str]:
    """The verdict details that say which evaluator judged (what a rerun compares: tracefleet.contract.rejudge), on
    every verdict: judge()'s and the Harbor verifier Job's."""
    return {"evaluator_spec": evaluator_fingerprint(plan.evaluator)}


def eval_context(plan: SessionPlan, workspace: PreparedWorkspace, patch: str, session_dir: Path, result: SessionResult,
                 harness_stdout: Path) -> EvalContext:
    return EvalContext(task=plan.task, workspace=workspace, patch=patch, session_dir=session_dir,
                       harness_exit_code=result.harness_exit_code, harness_stdout=harness_stdout,
                       metadata={"session_id": plan.session_id, "sample_index": plan.sample_index})


def evidence_of(result: SessionResult, *, task: Task | dict[str, str], capture: str | Path | None, patch: str, stderr: Path,
                policy_version: int | None) -> SessionEvidence:
    """The session's evidence for the diagnostics, from its judged result (here, in the evaluator Job,
    and in the sealer for a session that was never judged)."""
    return session_evidence(
        job=result.job, session_id=result.session_id, task=task, group_id=result.group_id,
        sample_index=result.sample_index, capture=capture, patch=patch,
        harness=HarnessEvidence(preset=result.harness, status=result.status, stage=result.stage, error=result.error,
                                exit_code=result.harness_exit_code, stderr_tail=read_tail(stderr)),
        evaluation=result.evaluation, timings=result.timings, policy_version=policy_version,
    )


# ---- the program


def run(plan: SessionPlan, place: Place) -> SessionRun:
    """The session, start to end, in `place`."""
    folders = place.folders(plan)
    for folder in (folders.work, folders.artifacts, folders.home):
        folder.mkdir(parents=True, exist_ok=True)
    result = SessionResult.for_plan(plan, folders.work)
    timings = result.timings
    started = time.monotonic()
    deadline = started + plan.harness.timeout_s
    connected = False
    workspace: PreparedWorkspace | None = None
    stdout, stderr = folders.artifacts / layout.HARNESS_STDOUT, folders.artifacts / layout.HARNESS_STDERR
    try:
        with _timed(timings, "prepare"):
            workspace = prepare_stage(plan, folders.work)
        with _timed(timings, "register"):
            endpoint = place.connect(plan, deadline)
            connected = True
        with _timed(timings, "harness"):
            workdir = place.harness_workdir(plan, workspace.workdir)
            launch = launch_stage(plan, workdir=workdir, home=folders.home, endpoint=endpoint)
            env = harness_environment(launch.env, place.user_env(plan), endpoint, str(folders.home))
            (folders.artifacts / "harness.json").write_text(
                json.dumps({"argv": launch.argv, "env_keys": sorted(env), "files": sorted(launch.files)}, indent=1))
            proc = place.run(plan, harness_argv(launch), cwd=workspace.workdir, home=folders.home, env=env,
                             timeout_s=max(0.0, deadline - time.monotonic()), stdout_path=stdout, stderr_path=stderr)
            wait_stage(proc, plan, result, stopped=place.stopped_reason, logs=folders.artifacts)
    except StageFailed as failed:
        failed.record(result)
    except Exception as exc:  # noqa: BLE001 - never leave a result that says "completed" after a crash
        result.fail("prepare" if workspace is None else "harness", "error", f"{type(exc).__name__}: {exc}")

    # The capture and the workspace diff are collected whatever happened above: nothing captured is lost.
    if connected:
        with _timed(timings, "capture"):
            place.disconnect(plan, result)
    patch = ""
    if workspace is not None:
        with _timed(timings, "collect"):
            elsewhere = getattr(place, "workspace_diff", None)
            patch = collect_stage(workspace, folders.artifacts, result,
                                  (lambda: elsewhere(plan, folders)) if elsewhere is not None else None)

    done = _judge_here(plan, result, workspace, patch, folders) if place.judges else SessionRun(result=result)
    if done.result.status != "completed":
        done.result.reward = 0.0
    done.result.timings["total"] = round(time.monotonic() - started, 4)
    place.finish(done.result, folders)
    return done


def _judge_here(plan: SessionPlan, result: SessionResult, workspace: PreparedWorkspace | None, patch: str,
                folders: SessionFolders) -> SessionRun:
    """evaluate → evidence → traces, where the session ran."""
    if result.status == "completed" and workspace is not None:
        with _timed(result.timings, "evaluate"):
            outcome = judge(plan, eval_context(plan, workspace, patch, folders.artifacts, result,
                                               folders.artifacts / layout.HARNESS_STDOUT))
        result = result.judged(outcome)
    if result.status == "stopped":  # run again later, never sealed
        return SessionRun(result=result)
    evidence: SessionEvidence | None = None
    try:
        evidence = evidence_of(result, task=plan.task, capture=result.capture_path, patch=patch,
                               stderr=folders.artifacts / layout.HARNESS_STDERR, policy_version=plan.policy_version)
        (folders.artifacts / layout.EVIDENCE).write_text(evidence.model_dump_json())
    except Exception as exc:  # noqa: BLE001 - the build below reads the same capture and fails closed
        result.error = f"{result.error + '; ' if result.error else ''}evidence: {type(exc).__name__}: {exc}"
    # Every finished session is sealed, with or without a capture (tracefleet.contract.semantics).
    traces: list[Trace] = []
    with _timed(result.timings, "build"):
        try:
            from tracefleet.runner.tracing import build_session_traces

            traces = build_session_traces(plan, result, evidence)
        except Exception as exc:  # noqa: BLE001
            result.fail("build", "error", f"building traces failed: {type(exc).__name__}: {exc}")
    return SessionRun(result=result, traces=traces, evidence=evidence)


# ---- this machine


class HostPlace:
    """This machine: the in-process proxy (sessions registered through its admin API), each harness in
    the runner's sandbox (process group, fresh HOME, optionally a loopback-only net namespace); judged
    here. Folders: `session_root/<capture name>` (a retry gets its own)."""

    judges = True
    stopped_reason = "interrupted"

    def __init__(self, *, admin: ProxyAdmin, proxy_url: str, session_root: Path, stop: threading.Event | None = None) -> None:
        self.admin, self.proxy_url, self.session_root, self.stop = admin, proxy_url.rstrip("/"), session_root, stop
        self._registered: dict[str, str] = {}  # session id -> its name at the proxy

    def folders(self, plan: SessionPlan) -> SessionFolders:
        d = self.session_root / plan.capture_name
        return SessionFolders(work=d, artifacts=d, home=d / "home")

    def connect(self, plan: SessionPlan, deadline: float) -> SessionEndpoint:
        try:
            registered = self.admin.create_session(plan.capture_name, metadata={
                "job": plan.job, "task": plan.task.id, "sample": plan.sample_index, "group": plan.group_id,
                "attempt": plan.attempt}, guided_calls=plan.guided_calls)
        except Exception as exc:  # noqa: BLE001 - any failure here is the register stage's
            raise StageFailed("register", "error", str(exc)) from exc
        self._registered[plan.capture_name] = registered.session_id
        return SessionEndpoint(base_url=self.proxy_url + registered.base_path, api_key=registered.secret)

    def user_env(self, plan: SessionPlan) -> dict[str, str]:
        return dict(plan.harness.env)

    def harness_workdir(self, plan: SessionPlan, workspace: Path) -> Path:
        """spec.harness.workspace.workdir, as in a pod, where the harness runs in its own namespaces and this
        machine allows the mounts (the workspace bound there: tracefleet.runner.netns); else the workspace's own
        folder."""
        return Path(plan.harness.workdir) if self._viewed(plan.harness) else workspace

    @staticmethod
    def _namespaced(harness: HarnessConfig) -> bool:
        return harness.netns and harness.bridge_socket is not None

    def _viewed(self, harness: HarnessConfig) -> bool:
        return self._namespaced(harness) and workdir_view_available()

    def _sandbox(self, harness: HarnessConfig) -> SandboxOptions:
        if self._namespaced(harness):
            port = int(self.proxy_url.rsplit(":", 1)[1].split("/")[0])
            return SandboxOptions(netns=True, bridge_port=port, bridge_socket=Path(str(harness.bridge_socket)),
                                  workdir=harness.workdir if self._viewed(harness) else None)
        return SandboxOptions()

    def run(self, plan: SessionPlan, argv: list[str], *, cwd: Path, home: Path, env: dict[str, str], timeout_s: float,
            stdout_path: Path, stderr_path: Path) -> ProcessResult:
        return run_sandboxed(argv, cwd=cwd, home=home, env=env, timeout_s=timeout_s, stdout_path=stdout_path,
                             stderr_path=stderr_path, options=self._sandbox(plan.harness), stop=self.stop)

    def disconnect(self, plan: SessionPlan, result: SessionResult) -> None:
        try:
            info = self.admin.close_session(self._registered.pop(plan.capture_name))
        except Exception as exc:  # noqa: BLE001
            result.fail("capture", "error", f"closing the proxy session failed: {exc}")
            return
        result.calls, result.call_errors, result.capture_path = info.calls, info.errors, info.capture_path
        result.abandoned_calls = info.abandoned

    def finish(self, result: SessionResult, folders: SessionFolders) -> None:
        (folders.artifacts / layout.RESULT).write_text(result.model_dump_json(indent=1))


def run_session(plan: SessionPlan, *, admin: ProxyAdmin, proxy_url: str, session_root: Path,
                stop: threading.Event | None = None) -> SessionRun:
    """The session on this machine (HostPlace)."""
    return run(plan, HostPlace(admin=admin, proxy_url=proxy_url, session_root=session_root, stop=stop))
