"""The environment the operator writes into the pods it creates and the pod programs read.

One typed model per container the operator builds; the builders call `to_env()`, the programs in
the pods call `from_env()`. Every `TRACEFLEET_*` name of this contract is a constant here and
nowhere else.

    HarnessEnv       harness container (`tracefleet run --in-pod`)
    ProxySidecarEnv  the harness pod's proxy sidecar (its other inputs are flags)
    EvaluatorEnv     evaluator Job (`python -m tracefleet.runner.pod evaluate`)
    SealerEnv        sealer Job (`python -m tracefleet.runner.pod seal`)

Values are text, as in a pod spec: numbers in decimal, lists and the inline task as JSON, the
sealer's sessions as ranges ("1-3,7"). An empty value counts as unset. Bucket credentials are not
here: they come from the job's Secret as `AWS_*` variables (`envFrom`), which `tracefleet.bucket`
reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError, model_validator

from tracefleet.contract.semantics import PlannedSession, decode_ranges, decode_sessions, encode_ranges
from tracefleet.contract.layout import session_uri

# What a pod program treats as its own input, never the harness's business (the harness container's
# environment minus these is what the harness process gets).
PREFIX = "TRACEFLEET_"

# ---- the bucket (evaluator and sealer Jobs)
BUCKET = "TRACEFLEET_BUCKET"  # bucket URI, `s3://bucket/prefix` or a local path
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"  # S3 endpoint (boto3 reads it too); the proxy sidecar's upload uses it

# ---- the session (harness pod and evaluator Job)
JOB = "TRACEFLEET_JOB"
SESSION = "TRACEFLEET_SESSION"  # the session's index within the job
TASK_INDEX = "TRACEFLEET_TASK_INDEX"
SAMPLE_INDEX = "TRACEFLEET_SAMPLE_INDEX"
# the task: one of the three; the file and the URI hold JSONL, line TASK_INDEX is the session's task
TASK_JSON = "TRACEFLEET_TASK_JSON"
TASKS_FILE = "TRACEFLEET_TASKS_FILE"
TASKS_URI = "TRACEFLEET_TASKS_URI"
COMMAND_JSON = "TRACEFLEET_COMMAND_JSON"  # argv of the `command` harness or evaluator
TIMEOUT_S = "TRACEFLEET_TIMEOUT_S"

# ---- the harness container
SESSION_ID = "TRACEFLEET_SESSION_ID"
BASE_URL = "TRACEFLEET_BASE_URL"  # the proxy sidecar
API_KEY = "TRACEFLEET_API_KEY"  # the session secret the sidecar accepts
MODEL = "TRACEFLEET_MODEL"
PRESET = "TRACEFLEET_PRESET"
WORKSPACE_SETUP_JSON = "TRACEFLEET_WORKSPACE_SETUP_JSON"  # spec.harness.workspace.setup
ARTIFACTS_DIR = "TRACEFLEET_ARTIFACTS_DIR"  # what the sidecar uploads when the pod stops
# Not written by the operator: an image or a test sets them.
JOB_DIR = "TRACEFLEET_JOB_DIR"  # base of relative task paths and `{job_dir}` (default: working directory)
WORK_DIR = "TRACEFLEET_WORK_DIR"  # where the workspace is prepared (default: working directory)

# ---- the proxy sidecar
SESSION_SECRET = "TRACEFLEET_SESSION_SECRET"  # expanded by the kubelet into `--session ID:SECRET`
# The inference engine's API key (spec.inference.{managed,external}.apiKeySecretRef), sent by the proxy as
# `Authorization: Bearer`. The operator sets it from the Secret (valueFrom), never as a value.
ENGINE_API_KEY = "TRACEFLEET_ENGINE_API_KEY"

# ---- the evaluator Job
EVALUATOR = "TRACEFLEET_EVALUATOR"  # spec.evaluator.preset
EVALUATOR_ENTRYPOINT = "TRACEFLEET_EVALUATOR_ENTRYPOINT"

# ---- the sealer Job
BATCH_SEQ = "TRACEFLEET_BATCH_SEQ"
SESSIONS = "TRACEFLEET_SESSIONS"
BUILDER = "TRACEFLEET_BUILDER"
# the sessions' tasks and samples, tracefleet.contract.semantics.encode_sessions (JSON [[index, task index,
# task id, sample], ...]): a failed session's pod may have left nothing that says which task it ran
SESSION_PLAN = "TRACEFLEET_SESSION_PLAN"
# spec.diagnostics in its wire form, JSON (unset: every built-in, action flag) and the job's policy version
# (the off-policy lag reference): the sealer runs the diagnostics (tracefleet.diagnostics)
DIAGNOSTICS_JSON = "TRACEFLEET_DIAGNOSTICS_JSON"
POLICY_VERSION = "TRACEFLEET_POLICY_VERSION"

# ---- a task's own image (Harbor tasks; the shared volume's layout is tracefleet.contract.taskimage)
LAUNCH_DIR = "TRACEFLEET_LAUNCH_DIR"  # session container: launch the harness in the task container through here
TASK_WORKDIR = "TRACEFLEET_TASK_WORKDIR"  # task.toml's [environment].workdir (unset: the image's WORKDIR)
VERIFIER_TIMEOUT_S = "TRACEFLEET_VERIFIER_TIMEOUT_S"  # [verifier].timeout_sec, whole seconds (the task image's step)
# spec.harness.env for the session container, which cannot take it from its own environment (the harness runs in
# another container; the session container's environment is the tracefleet image's)
HARNESS_ENV_JSON = "TRACEFLEET_HARNESS_ENV_JSON"
HARBOR_URI = "TRACEFLEET_HARBOR_URI"  # spec.tasks.harbor.uri: where the evaluator's fetch step reads the task's tests


# The evaluator Job's exit code for "this session's artifacts are unusable": its podFailurePolicy fails
# the Job on it instead of retrying (the builder writes the policy, the evaluator program exits with it).
EVALUATOR_FATAL_EXIT_CODE = 3


class PodEnvError(ValueError):
    """A pod's environment is incomplete or invalid: a problem of the manifest, not of the session."""


def _from_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _from_ranges(value: Any) -> Any:
    return decode_ranges(value) if isinstance(value, str) else value


# A value carried as JSON text (sorted keys: the same task always gives the same pod spec).
JsonList = Annotated[list[str], BeforeValidator(_from_json), PlainSerializer(lambda v: json.dumps(v, sort_keys=True))]
JsonObject = Annotated[dict[str, Any], BeforeValidator(_from_json), PlainSerializer(lambda v: json.dumps(v, sort_keys=True))]
Ranges = Annotated[list[int], BeforeValidator(_from_ranges), PlainSerializer(encode_ranges)]
JsonObjects = Annotated[list[dict[str, Any]], BeforeValidator(_from_json), PlainSerializer(lambda v: json.dumps(v, sort_keys=True))]


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class PodEnv(BaseModel):
    """One container's environment: fields are aliased by their variable names."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    # Where the operator sets it, for the error a pod program prints.
    container: ClassVar[str] = "pod"

    def to_env(self) -> dict[str, str]:
        """The variables, as the operator writes them into the container spec; unset ones left out."""
        return {name: _text(v) for name, v in self.model_dump(by_alias=True, exclude_none=True).items()}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Read from `env` (default: this process's environment); a missing or invalid variable is a
        PodEnvError whose one-line message names it."""
        env = os.environ if env is None else env
        names = {f.alias for f in cls.model_fields.values()}
        try:
            return cls.model_validate({k: v for k, v in env.items() if k in names and v != ""})
        except ValidationError as exc:
            raise PodEnvError(cls._problem(exc, env)) from None

    @classmethod
    def _problem(cls, exc: ValidationError, env: Mapping[str, str]) -> str:
        err = exc.errors(include_url=False)[0]
        where = f"(the operator sets it on the {cls.container})"
        if not err["loc"]:  # a rule across variables
            return f"{err['msg'].removeprefix('Value error, ')} (the operator sets these on the {cls.container})"
        name = str(err["loc"][0])
        if err["type"] == "missing":
            return f"{name} is not set {where}"
        return f"{name}={env.get(name, '')!r} is invalid: {err['msg'].removeprefix('Value error, ')} {where}"


class BucketEnv(PodEnv):
    bucket: str = Field(alias=BUCKET)
    endpoint: str | None = Field(default=None, alias=AWS_ENDPOINT_URL)


class SessionEnv(PodEnv):
    """Which session of which job, and its task: the harness pod and the evaluator Job read the task
    the same way, and neither needs API access for it."""

    job: str = Field(alias=JOB)
    session: int = Field(ge=0, alias=SESSION)
    task_index: int = Field(ge=0, alias=TASK_INDEX)
    sample_index: int = Field(ge=0, alias=SAMPLE_INDEX)
    task_json: JsonObject | None = Field(default=None, alias=TASK_JSON)
    tasks_file: str | None = Field(default=None, alias=TASKS_FILE)
    tasks_uri: str | None = Field(default=None, alias=TASKS_URI)

    @property
    def has_task(self) -> bool:
        return any(v is not None for v in (self.task_json, self.tasks_file, self.tasks_uri))


class HarnessEnv(SessionEnv):
    container: ClassVar[str] = "harness container"

    session_id: str = Field(alias=SESSION_ID)
    base_url: str = Field(alias=BASE_URL)
    api_key: str = Field(alias=API_KEY)
    model: str | None = Field(default=None, alias=MODEL)
    preset: str | None = Field(default=None, alias=PRESET)
    timeout_s: float = Field(gt=0, alias=TIMEOUT_S)
    artifacts_dir: str = Field(default="/artifacts", alias=ARTIFACTS_DIR)
    command: JsonList | None = Field(default=None, alias=COMMAND_JSON)
    workspace_setup: JsonList | None = Field(default=None, alias=WORKSPACE_SETUP_JSON)
    job_dir: str | None = Field(default=None, alias=JOB_DIR)
    work_dir: str | None = Field(default=None, alias=WORK_DIR)
    # set in a Harbor task's pod: the harness runs in the task container, launched through this folder
    launch_dir: str | None = Field(default=None, alias=LAUNCH_DIR)
    harness_env: JsonObject | None = Field(default=None, alias=HARNESS_ENV_JSON)

    @model_validator(mode="after")
    def _needs_a_task(self) -> Self:
        if not self.has_task:
            raise ValueError(f"no task: set {TASK_JSON}, {TASKS_FILE} or {TASKS_URI}")
        return self


class ProxySidecarEnv(PodEnv):
    container: ClassVar[str] = "proxy sidecar"

    session_secret: str = Field(alias=SESSION_SECRET)
    endpoint: str | None = Field(default=None, alias=AWS_ENDPOINT_URL)


class EvaluatorEnv(SessionEnv, BucketEnv):
    container: ClassVar[str] = "evaluator Job"

    evaluator: str | None = Field(default=None, alias=EVALUATOR)
    entrypoint: str | None = Field(default=None, alias=EVALUATOR_ENTRYPOINT)
    command: JsonList | None = Field(default=None, alias=COMMAND_JSON)
    timeout_s: float = Field(gt=0, alias=TIMEOUT_S)
    # the job's policy version when the session is judged: its evidence's lag reference, as local mode's
    policy_version: int | None = Field(default=None, ge=0, alias=POLICY_VERSION)
    # set for a Harbor task: its source (the fetch step reads the task's tests/ there); the verdict is Harbor's
    harbor_uri: str | None = Field(default=None, alias=HARBOR_URI)

    @property
    def session_uri(self) -> str:
        """The session's folder in the bucket: what the sidecar uploaded, where reward.json goes."""
        return session_uri(self.bucket, self.job, self.session)


class SealerEnv(BucketEnv):
    container: ClassVar[str] = "sealer Job"

    job: str = Field(alias=JOB)
    batch_seq: int = Field(ge=0, alias=BATCH_SEQ)
    sessions: Ranges = Field(alias=SESSIONS)
    builder: str = Field(alias=BUILDER)
    session_plan: str = Field(alias=SESSION_PLAN)  # the sessions with their tasks and samples
    diagnostics: JsonObjects | None = Field(default=None, alias=DIAGNOSTICS_JSON)
    policy_version: int | None = Field(default=None, ge=0, alias=POLICY_VERSION)

    def diagnostic_specs(self) -> list[Any] | None:
        """spec.diagnostics (tracefleet.contract.job.DiagnosticSpec), None when the job lists none."""
        if self.diagnostics is None:
            return None
        from pydantic import TypeAdapter

        from tracefleet.contract.job import DiagnosticSpec

        try:
            return TypeAdapter(list[DiagnosticSpec]).validate_python(self.diagnostics)
        except ValidationError as exc:
            raise PodEnvError(f"{DIAGNOSTICS_JSON}: {exc.errors(include_url=False)[0]['msg']} "
                              f"(the operator sets it on the {self.container})") from None

    def planned_sessions(self) -> list[PlannedSession]:
        """The sessions to seal, with their tasks, groups and samples."""
        planned = decode_sessions(self.job, self.session_plan)
        if sorted(p.index for p in planned) != sorted(self.sessions):
            raise PodEnvError(f"{SESSION_PLAN} names sessions {encode_ranges([p.index for p in planned])}, "
                              f"{SESSIONS} {encode_ranges(self.sessions)} (the operator sets both on the {self.container})")
        return planned
