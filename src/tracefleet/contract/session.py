"""One session's messages: its plan, what the harness's place reports (result.json) and what the evaluator
says (reward.json). Every driver writes and reads them through these models.

    Task           a task as a session runs it (one prompt, where its workspace comes from, how to judge it)
    HarnessConfig  the harness: preset (its default applied here, once), command, the user's env, timeout
    EvaluatorSpec  how to judge the session
    SessionPlan    one session of a job: the above plus its ids (`session_id`: one format in both drivers); planned
                   once by tracefleet.contract.plan.plan_sessions and handed whole to every program of the session
    SessionResult  result.json: how the session went where it ran; judged, it also holds the evaluation
    EvalOutcome    an evaluator's verdict
    Verdict        reward.json: the evaluator Job's verdict on one session (an EvalOutcome with its ids)

Session ids: `<job>-s<index>` with the job-wide session index (task index × samplesPerTask + sample
index), the same from `tracefleet run` and the operator, so a trainer joins a job's rows across drivers.
Retries and reruns keep the id; what keeps their captures apart is where they are written (a retry's own
proxy sidecar on a cluster; locally a capture folder per run and a capture name per attempt,
`SessionPlan.capture_name`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tracefleet.contract.harbor import HarborTaskRun
from tracefleet.contract.job import DiagnosticSpec, is_remote
# A harness without a preset runs its `command`; HarnessConfig applies that (every session, both drivers)
from tracefleet.contract.semantics import (
    DEFAULT_PRESET,
    EVALUATOR_TIMEOUT_S,
    SESSION_TIMEOUT_S,
    SETUP_TIMEOUT_S,
    WORKDIR,
    OutcomeKind,
    harness_preset,
)

# In spec.harness.command: the folder of the job file (locally) or TRACEFLEET_JOB_DIR (in a pod), so a job can ship
# its own harness script next to its manifest.
JOB_DIR_PLACEHOLDER = "{job_dir}"

def session_id(job: str, index: int) -> str:
    """The session id of the job's session `index` (job-wide), in both drivers."""
    return f"{job}-s{index}"


def with_job_dir(argv: list[str], job_dir: Path) -> list[str]:
    """`argv` with JOB_DIR_PLACEHOLDER replaced by `job_dir`."""
    return [a.replace(JOB_DIR_PLACEHOLDER, str(job_dir)) for a in argv]


# ---------------------------------------------------------------- the task


class Task(BaseModel):
    """A task as the runner sees it. Tasks arrive from the RolloutJob (inline entries, JSONL lines) as
    plain mappings; unknown keys are kept in `extra` and travel into trace metadata."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str
    prompt: str
    # Where the workspace comes from (at most one; none = an empty git repo).
    repo: str | None = None  # a git repository (path or URL) or a plain directory (made a repo at run time)
    ref: str | None = None  # commit, tag or branch to check out in repo
    archive: str | None = None  # .tar, .tar.gz, .tgz or .zip
    files: dict[str, str] | None = None  # inline files: relative path -> content
    setup: list[str] = Field(default_factory=list)  # shell commands run once in the workspace
    # Test-based evaluation (SWE-bench style). Names as the test runner prints them.
    fail_to_pass: list[str] = Field(default_factory=list, alias="FAIL_TO_PASS")
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")
    test_command: str | list[str] | None = None
    protected: list[str] = Field(default_factory=list)  # paths restored from the original before testing
    metadata: dict[str, Any] = Field(default_factory=dict)
    harbor: HarborTaskRun | None = None  # a Harbor task folder: its sessions run in a container of its image

    @model_validator(mode="before")
    @classmethod
    def _accept_aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "id" not in data:
                for key in ("task_id", "instance_id", "name"):
                    if key in data:
                        data["id"] = str(data[key])
                        break
            if "prompt" not in data:
                for key in ("problem_statement", "instruction", "input"):
                    if key in data:
                        data["prompt"] = data[key]
                        break
            if isinstance(data.get("setup"), str):
                data["setup"] = [data["setup"]]
        return data

    @model_validator(mode="after")
    def _one_source(self) -> Task:
        sources = [s for s in (self.repo, self.archive, self.files) if s]
        if len(sources) > 1:
            raise ValueError(f"task {self.id}: give at most one of repo, archive, files")
        return self

    def resolved(self, base_dir: Path) -> Task:
        """Relative repo/archive paths are relative to the job file's directory."""
        update: dict[str, Any] = {}
        for key in ("repo", "archive"):
            value = getattr(self, key)
            if value and not is_remote(value) and not Path(value).is_absolute():
                update[key] = str((base_dir / value).resolve())
        return self.model_copy(update=update)

    def extra_fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# ---------------------------------------------------------------- judging

# ok: the evaluator ran and judged (reward may still be 0); the rest are failures of the judging. `unavailable`:
# the evaluator could not run or report, for a reason the agent could not cause (tracefleet.contract.semantics:
# the row is the infrastructure's, left out of training); `error`, `timeout` and `patch_failed` stay the policy's.
EvalStatus = Literal["ok", "error", "timeout", "patch_failed", "skipped", "unavailable"]


class EvaluatorSpec(BaseModel):
    """How to judge a session. `type` picks the evaluator; the other fields are per type."""

    model_config = ConfigDict(extra="allow")

    type: Literal["command", "tests", "python", "harbor", "none"] = "tests"
    command: str | list[str] | None = None  # command: shell string or argv; tests: the test command
    entrypoint: str | None = None  # python: "module:function" or an entry point name
    timeout_s: float = EVALUATOR_TIMEOUT_S
    live_workspace: bool = False  # command: judge the harness's live workspace instead of a fresh copy
    env: dict[str, str] = Field(default_factory=dict)


# Environment variables of this name prefix are the place's (the evaluator Job's artifacts folder), not the job's.
_PLACE_ENV_PREFIX = "TRACEFLEET_"


def evaluator_fingerprint(spec: EvaluatorSpec) -> str:
    """What the job asked of its evaluator, as a short hash (a verdict's `details.evaluator_spec`): a rerun re-judges
    a judging that timed out only when the evaluator it would judge with now differs (tracefleet.runner.rejudge)."""
    asked = spec.model_dump(mode="json")
    asked["env"] = {k: v for k, v in sorted(spec.env.items()) if not k.startswith(_PLACE_ENV_PREFIX)}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]


class EvalOutcome(BaseModel):
    """An evaluator's verdict. Evaluators fail closed: any error or timeout is reward 0 with the status
    saying why."""

    reward: float = 0.0
    status: EvalStatus = "ok"
    message: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    # Every named metric the judging produced (Harbor's reward.json), kept also when it failed closed; the training
    # reward is `reward` (for Harbor: reward.txt's number or reward.json's "reward" metric).
    metrics: dict[str, float] = Field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def failed_closed(self) -> bool:
        return self.status != "ok"

    def judging(self) -> EvalOutcome:
        """The verdict itself, without whatever a subclass adds (what a session's result keeps)."""
        return EvalOutcome.model_validate(self.model_dump(include=set(EvalOutcome.model_fields)))


class Verdict(EvalOutcome):
    """reward.json (layout.reward_key): the evaluator Job's verdict on one session, with its ids."""

    task_id: str | None = None
    sample_index: int | None = None
    evaluator: str | None = None  # the runner's evaluator type that judged


# ---------------------------------------------------------------- the session

SessionStatus = Literal["completed", "timeout", "error", "stopped"]
Stage = Literal["prepare", "register", "harness", "collect", "evaluate", "capture", "build"]


class HarnessConfig(BaseModel):
    preset: str = DEFAULT_PRESET
    command: list[str] | None = None  # for the command preset; {prompt} and {workdir} substituted
    env: dict[str, str] = Field(default_factory=dict)  # spec.harness.env (precedence: tracefleet.runner.environment)
    timeout_s: float = SESSION_TIMEOUT_S  # a Harbor task's shorter [agent].timeout_sec already applied by the planner
    workdir: str = WORKDIR  # spec.harness.workspace.workdir: where the harness starts (a Harbor task: its image's own)
    netns: bool = False  # loopback-only network namespace (proxy reachable through a bridge)
    bridge_socket: str | None = None

    @field_validator("preset", mode="before")
    @classmethod
    def _default_preset(cls, value: Any) -> Any:
        return harness_preset(value) if value is None or isinstance(value, str) else value


class SessionPlan(BaseModel):
    """One session of a job, as tracefleet.contract.plan.plan_sessions planned it: the value the operator ships to
    every pod of the session (tracefleet.contract.plan_files) and `tracefleet run` hands to the session program."""

    index: int = Field(ge=0)  # the job-wide session index (tracefleet.contract.semantics)
    session_id: str
    job: str
    task: Task
    sample_index: int = 0
    group_id: str
    harness: HarnessConfig
    evaluator: EvaluatorSpec
    model: str
    builder: str = "prefix-merge"
    setup_timeout_s: float = SETUP_TIMEOUT_S
    # spec.diagnostics (None: built-ins, flag only)
    # model, which is not on this floor yet
    diagnostics: list[DiagnosticSpec] | None = None
    policy_version: int | None = None  # the job's policy version (off-policy lag reference)
    attempt: int = 0  # 0, then 1.. for each retry (spec.maxRetries) of the same session
    # a guided prefix (tracefleet train --guide): the session's first N model calls answered by the proxy's guide
    # engine, the task's demonstration, as context the policy continues from; never a trainable token. Set by the
    # trainer on the local driver, whose proxy has the guide; a harness pod's sidecar has none and refuses it.
    guided_calls: int = Field(default=0, ge=0)

    def at(self, job_dir: Path) -> SessionPlan:
        """The plan settled where it runs: relative task paths and `{job_dir}` in the harness command are the job
        folder's (the job file's folder locally, TRACEFLEET_JOB_DIR or the working directory in a pod)."""
        command = with_job_dir(self.harness.command, job_dir) if self.harness.command else None
        return self.model_copy(update={"task": self.task.resolved(job_dir),
                                       "harness": self.harness.model_copy(update={"command": command})})

    @property
    def capture_name(self) -> str:
        """This attempt's name where several attempts share a place (one proxy, one work folder): the
        session id, with `-a<attempt>` for a retry."""
        return self.session_id if self.attempt == 0 else f"{self.session_id}-a{self.attempt}"


class SessionResult(BaseModel):
    """result.json: written by the session program where the session ran (a local session folder, the
    harness pod's artifacts); a place that judges (the host) adds the evaluation, the sealer adds the
    evaluator Job's verdict (`judged`)."""

    session_id: str
    job: str
    task_id: str
    sample_index: int
    group_id: str
    harness: str | None = None  # the preset that ran
    model: str | None = None  # the model name the harness asked for
    task_metadata: dict[str, Any] = Field(default_factory=dict)  # the task's metadata (trace metadata carries it)
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
    # whose outcome its rows are (tracefleet.contract.semantics.OutcomeKind), once they are built where it ran
    outcome_kind: OutcomeKind | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    session_dir: str = ""

    @classmethod
    def for_plan(cls, plan: SessionPlan, session_dir: Path | str = "") -> SessionResult:
        """A fresh (completed, so far) result of the planned session: the same in every place."""
        return cls(session_id=plan.session_id, job=plan.job, task_id=plan.task.id, sample_index=plan.sample_index,
                   group_id=plan.group_id, harness=plan.harness.preset, model=plan.model,
                   task_metadata=dict(plan.task.metadata), session_dir=str(session_dir))

    def fail(self, stage: Stage, status: SessionStatus, message: str) -> None:
        """Record the first failure; later ones only add to the message."""
        if self.status == "completed":
            self.status, self.stage, self.error = status, stage, message
        else:
            self.error = f"{self.error}; {stage}: {message}"

    def judged(self, outcome: EvalOutcome) -> SessionResult:
        """This result with the evaluator's verdict: its reward when it judged (`ok`), else reward 0 and
        the session failed at `evaluate` (fail closed). The one rule, wherever the judging ran."""
        out = self.model_copy(deep=True)
        out.evaluation = outcome.judging()
        out.reward = outcome.reward if outcome.status == "ok" else 0.0
        if outcome.status in ("error", "patch_failed", "unavailable"):
            out.fail("evaluate", "error", outcome.message or outcome.status)
        elif outcome.status == "timeout":
            out.fail("evaluate", "timeout", outcome.message or "evaluator timed out")
        return out

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
