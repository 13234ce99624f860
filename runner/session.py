"""One session end to end:

prepare workspace → register with the proxy → start the harness (preset: argv, env, HOME files) in its
own process group / workdir / HOME (optionally a loopback-only net namespace) → wait under the session
timeout (kill the group) → close the proxy session (capture log flushed) → collect artifacts (git diff,
stdout/stderr, exit code) → evaluate (fail closed) → build traces.

Every stage is timed. The result says `completed`, `timeout` (with the stage that ran out of time) or
`error` (with the stage that failed). Whatever happens, the proxy session is closed and the captured
calls are turned into traces: a failed session's traces are kept, marked by their outcome and with no
positive reward (design invariant 4), never dropped.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, Field

from tracefleet.contract import layout
from tracefleet.contract.job import DiagnosticSpec
from tracefleet.diagnostics.evidence import HarnessEvidence, SessionEvidence, read_tail, session_evidence
from tracefleet.runner.evaluators import EvalContext, EvalOutcome, EvaluatorSpec, get_evaluator
from tracefleet.runner.proxy_admin import ProxyAdmin, RegisteredSession
from tracefleet.runner.sandbox import ProcessResult, SandboxOptions, run_sandboxed
from tracefleet.runner.task import Task
from tracefleet.runner.workspace import WorkspaceError, prepare_workspace, workspace_patch

SessionStatus = Literal["completed", "timeout", "error", "stopped"]
Stage = Literal["prepare", "register", "harness", "collect", "evaluate", "capture", "build"]


class HarnessConfig(BaseModel):
    preset: str = "command"
    command: list[str] | None = None  # for the command preset; {prompt} and {workdir} substituted
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = 1800
    netns: bool = False  # loopback-only network namespace (proxy reachable through a bridge)
    bridge_socket: str | None = None


class SessionPlan(BaseModel):
    session_id: str
    job: str
    task: Task
    sample_index: int = 0
    group_id: str
    harness: HarnessConfig
    evaluator: EvaluatorSpec
    model: str
    builder: str = "prefix-merge"
    setup_timeout_s: float = 600
    diagnostics: list[DiagnosticSpec] | None = None  # spec.diagnostics (None: built-ins, flag only)
    policy_version: int | None = None  # the job's policy version (off-policy lag reference)


class SessionResult(BaseModel):
    session_id: str
    job: str
    task_id: str
    sample_index: int
    group_id: str
    harness: str | None = None  # the preset that ran
    model: str | None = None  # the model name the harness asked for
    status: SessionStatus = "completed"
    stage: Stage | None = None  # the stage that timed out or failed
    error: str | None = None
    reward: float = 0.0
    evaluation: EvalOutcome | None = None
    harness_exit_code: int | None = None
    calls: int = 0
    call_errors: int = 0
    abandoned_calls: int = 0  # cut off in flight (harness gone or killed): recorded, their engine requests cancelled
    capture_path: str | None = None
    capture_torn: bool = False
    patch_bytes: int = 0
    traces: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    build_stats: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    session_dir: str

    @classmethod
    def for_plan(cls, plan: SessionPlan, session_dir: Path) -> SessionResult:
        """A fresh (completed, so far) result of the planned session: the same in both drivers."""
        return cls(session_id=plan.session_id, job=plan.job, task_id=plan.task.id, sample_index=plan.sample_index,
                   group_id=plan.group_id, harness=plan.harness.preset, model=plan.model, session_dir=str(session_dir))

    @property
    def outcome(self) -> str:
        """A short label for trace metadata: what a trainer filters on."""
        if self.status != "completed":
            return f"{self.status}:{self.stage}"
        if self.evaluation is not None and self.evaluation.status != "ok":
            return f"evaluator_{self.evaluation.status}"
        if self.capture_torn:
            return "capture_incomplete"
        return "ok"


@dataclass
class SessionRun:
    result: SessionResult
    traces: list[Any] = field(default_factory=list)  # built traces, ready for sealing
    evidence: SessionEvidence | None = None  # what the diagnostics read (tracefleet.diagnostics)


class StageFailed(Exception):
    """A lifecycle stage ended the session: which stage, with what status."""

    def __init__(self, stage: Stage, status: SessionStatus, message: str) -> None:
        super().__init__(message)
        self.stage, self.status = stage, status

    def record(self, result: SessionResult) -> None:
        result.status, result.stage, result.error = self.status, self.stage, str(self)


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        timings[stage] = round(time.monotonic() - started, 4)


def harness_launch(plan: SessionPlan, *, workdir: Path, home: Path, base_url: str, api_key: str) -> Any:
    """The preset's HarnessLaunch (argv, env, files) for this session."""
    from tracefleet.runner.presets import get_preset

    preset = get_preset(plan.harness.preset)
    kwargs: dict[str, Any] = dict(
        prompt=plan.task.prompt, workdir=workdir, home=home, base_url=base_url, api_key=api_key, model=plan.model
    )
    if plan.harness.command:
        kwargs["command"] = list(plan.harness.command)
    return preset.launch(**kwargs)


# ---- the session lifecycle's stages, the same in local mode (run_session) and in a harness pod
# (tracefleet.runner.pod.harness): prepare → launch → wait → collect; then evaluate and build traces.


def prepare_stage(plan: SessionPlan, session_dir: Path) -> Any:
    """The session's workspace (the task's repository, set up)."""
    try:
        return prepare_workspace(plan.task, session_dir, setup_timeout_s=plan.setup_timeout_s)
    except WorkspaceError as exc:
        raise StageFailed("prepare", "timeout" if "timed out" in str(exc) else "error", str(exc)) from exc


def launch_stage(plan: SessionPlan, *, workdir: Path, home: Path, base_url: str, api_key: str) -> Any:
    """The preset's launch, its HOME files written."""
    try:
        launch = harness_launch(plan, workdir=workdir, home=home, base_url=base_url, api_key=api_key)
        for rel, content in launch.files.items():
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
    except Exception as exc:  # noqa: BLE001 - a preset that cannot launch is this session's error
        raise StageFailed("harness", "error", f"preset {plan.harness.preset}: {type(exc).__name__}: {exc}") from exc
    return launch


def wait_stage(proc: ProcessResult, plan: SessionPlan, result: SessionResult, *, stopped: str) -> None:
    """How the harness process ended, as the session's outcome."""
    result.harness_exit_code = proc.exit_code
    if proc.start_error:
        raise StageFailed("harness", "error", f"harness did not start: {proc.start_error}")
    if proc.stopped:
        raise StageFailed("harness", "stopped", stopped)
    if proc.timed_out:
        raise StageFailed("harness", "timeout", f"harness ran past {plan.harness.timeout_s:.0f}s; process group killed")
    if proc.exit_code != 0:
        raise StageFailed("harness", "error", f"harness exited {proc.exit_code}")


def collect_stage(workspace: Any, dest: Path, result: SessionResult) -> str:
    """The workspace's diff against its base commit, written to dest/session.patch (after any outcome:
    nothing the harness did is lost)."""
    try:
        patch = workspace_patch(workspace.workdir, workspace.base_commit)
        (dest / layout.PATCH).write_text(patch)
    except Exception as exc:  # noqa: BLE001
        _fail(result, "collect", "error", f"git diff of the workspace failed: {exc}")
        return ""
    result.patch_bytes = len(patch.encode())
    return patch


def run_session(
    plan: SessionPlan,
    *,
    admin: ProxyAdmin,
    proxy_url: str,
    session_root: Path,
    stop: threading.Event | None = None,
) -> SessionRun:
    session_dir = session_root / plan.session_id
    session_dir.mkdir(parents=True, exist_ok=True)
    result = SessionResult.for_plan(plan, session_dir)
    timings = result.timings
    started = time.monotonic()
    deadline = started + plan.harness.timeout_s
    registered: RegisteredSession | None = None
    workspace = None
    proc: ProcessResult | None = None
    patch = ""
    try:
        with _timed(timings, "prepare"):
            workspace = prepare_stage(plan, session_dir)
        with _timed(timings, "register"):
            try:
                registered = admin.create_session(
                    plan.session_id,
                    metadata={"job": plan.job, "task": plan.task.id, "sample": plan.sample_index, "group": plan.group_id},
                )
            except Exception as exc:  # noqa: BLE001 - any failure here is the register stage's
                raise StageFailed("register", "error", str(exc)) from exc
        with _timed(timings, "harness"):
            home = session_dir / "home"
            home.mkdir(parents=True, exist_ok=True)
            launch = launch_stage(plan, workdir=workspace.workdir, home=home,
                                  base_url=proxy_url.rstrip("/") + registered.base_path, api_key=registered.secret)
            options = SandboxOptions()
            if plan.harness.netns and plan.harness.bridge_socket:
                port = int(proxy_url.rsplit(":", 1)[1].split("/")[0])
                options = SandboxOptions(netns=True, bridge_port=port, bridge_socket=Path(plan.harness.bridge_socket))
            env = {**launch.env, **plan.harness.env}
            (session_dir / "harness.json").write_text(
                json.dumps({"argv": launch.argv, "env_keys": sorted(env), "files": sorted(launch.files)}, indent=1)
            )
            proc = run_sandboxed(
                list(launch.argv),
                cwd=workspace.workdir,
                home=home,
                env=env,
                timeout_s=max(0.0, deadline - time.monotonic()),
                stdout_path=session_dir / layout.HARNESS_STDOUT,
                stderr_path=session_dir / layout.HARNESS_STDERR,
                options=options,
                stop=stop,
            )
            wait_stage(proc, plan, result, stopped="interrupted")
    except StageFailed as failed:
        failed.record(result)

    # The capture and the workspace diff are collected whatever happened above: nothing captured is lost.
    with _timed(timings, "capture"):
        if registered is not None:
            try:
                info = admin.close_session(registered.session_id)
                result.calls, result.call_errors, result.capture_path = info.calls, info.errors, info.capture_path
                result.abandoned_calls = info.abandoned
            except Exception as exc:  # noqa: BLE001
                _fail(result, "capture", "error", f"closing the proxy session failed: {exc}")
    if workspace is not None and result.stage not in ("prepare",):
        with _timed(timings, "collect"):
            patch = collect_stage(workspace, session_dir, result)

    if result.status == "completed" and workspace is not None:
        with _timed(timings, "evaluate"):
            ctx = EvalContext(
                task=plan.task,
                workspace=workspace,
                patch=patch,
                session_dir=session_dir,
                harness_exit_code=result.harness_exit_code,
                harness_stdout=session_dir / layout.HARNESS_STDOUT,
                metadata={"session_id": plan.session_id, "sample_index": plan.sample_index},
            )
            try:
                outcome = get_evaluator(plan.evaluator).evaluate(ctx)
            except Exception as exc:  # noqa: BLE001 - evaluators fail closed; this catches their construction
                outcome = EvalOutcome(status="error", message=f"{type(exc).__name__}: {exc}")
            result.evaluation = outcome
            result.reward = outcome.reward if outcome.status == "ok" else 0.0
            if outcome.status in ("error", "patch_failed"):
                _fail(result, "evaluate", "error", outcome.message or outcome.status)
            elif outcome.status == "timeout":
                _fail(result, "evaluate", "timeout", outcome.message or "evaluator timed out")

    traces: list[Any] = []
    evidence: SessionEvidence | None = None
    if result.status != "stopped":
        try:
            evidence = evidence_stage(plan, result, session_dir, patch)
        except Exception as exc:  # noqa: BLE001 - the build below reads the same capture and fails closed
            result.error = f"{result.error + '; ' if result.error else ''}evidence: {type(exc).__name__}: {exc}"
    # Every finished session is sealed, with or without a capture (tracefleet.contract.semantics); a stopped
    # one is run again later instead.
    if result.status != "stopped":
        with _timed(timings, "build"):
            try:
                from tracefleet.runner.tracing import build_session_traces

                traces = build_session_traces(plan, result, evidence)
            except Exception as exc:  # noqa: BLE001
                _fail(result, "build", "error", f"building traces failed: {type(exc).__name__}: {exc}")
    if result.status != "completed":
        result.reward = 0.0
    timings["total"] = round(time.monotonic() - started, 4)
    (session_dir / "result.json").write_text(result.model_dump_json(indent=1))
    return SessionRun(result=result, traces=traces, evidence=evidence)


def evidence_stage(plan: SessionPlan, result: SessionResult, session_dir: Path, patch: str) -> SessionEvidence:
    """The session's evidence for the diagnostics, after judging, written to session_dir/evidence.json.
    (On Kubernetes the evaluator Job builds it with the same function: tracefleet.runner.pod.evaluate.)"""
    evidence = session_evidence(
        job=plan.job, session_id=plan.session_id, task=plan.task, group_id=plan.group_id, sample_index=plan.sample_index,
        capture=result.capture_path, patch=patch,
        harness=HarnessEvidence(preset=plan.harness.preset, status=result.status, stage=result.stage, error=result.error,
                                exit_code=result.harness_exit_code, stderr_tail=read_tail(session_dir / layout.HARNESS_STDERR)),
        evaluation=result.evaluation, timings=result.timings, policy_version=plan.policy_version,
    )
    (session_dir / layout.EVIDENCE).write_text(evidence.model_dump_json())
    return evidence


def _fail(result: SessionResult, stage: Stage, status: SessionStatus, message: str) -> None:
    """Record the first failure; later ones only add to the message."""
    if result.status == "completed":
        result.status, result.stage, result.error = status, stage, message
    else:
        result.error = f"{result.error}; {stage}: {message}"
