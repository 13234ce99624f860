"""The environment the operator writes into the pods it creates and the pod programs read.

One typed model per container the operator builds; the builders call `to_env()`, the programs in
the pods call `from_env()`. Every `TRACEFLEET_*` name of this contract is a constant here and
nowhere else. A session's plan (tracefleet.contract.session.SessionPlan, planned by
tracefleet.contract.plan.plan_sessions) travels whole, as files in the folder PLAN_DIR names (a plan can outgrow an
environment entry: tracefleet.contract.plan_files); the variables are the place's own inputs.

    HarnessEnv       harness container (`tracefleet run --in-pod`)
    ProxySidecarEnv  the harness pod's proxy sidecar (its other inputs are flags)
    EvaluatorEnv     evaluator Job (`python -m tracefleet.runner.pod evaluate`)
    SealerEnv        sealer Job (`python -m tracefleet.runner.pod seal`)

Values are text, as in a pod spec: numbers in decimal, the sealer's sessions as ranges ("1-3,7"); plans are JSON
files. An empty value counts as unset. Bucket credentials are not
here: they come from the job's Secret as `AWS_*` variables (`envFrom`), which `tracefleet.bucket`
reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError, model_validator

from tracefleet.contract.layout import session_uri
from tracefleet.contract.plan_files import PLAN_FOLDER, SESSION_PLAN, SESSION_PLANS, SIDECAR_PLAN, read_parts, split_parts
from tracefleet.contract.proxy_plan import SidecarPlan
from tracefleet.contract.semantics import decode_ranges, encode_ranges
from tracefleet.contract.session import SessionPlan

# What a pod program treats as its own input, never the harness's business (the harness container's
# environment minus these is what the harness process gets).
PREFIX = "TRACEFLEET_"

# ---- the bucket (evaluator and sealer Jobs)
BUCKET = "TRACEFLEET_BUCKET"  # bucket URI, `s3://bucket/prefix` or a local path
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"  # S3 endpoint (boto3 reads it too); the proxy sidecar's upload uses it

# ---- the session (every pod of it): its plan, whole
# tracefleet.contract.session.SessionPlan as JSON, planned by tracefleet.contract.plan.plan_sessions in the operator
# and validated on arrival with the same model; the sealer Job gets the plans of the sessions it seals (a JSON list).
# They are files (tracefleet.contract.plan_files) in the folder this names; the operator sets it to PLAN_FOLDER.
PLAN_DIR = "TRACEFLEET_PLAN_DIR"
JOB = "TRACEFLEET_JOB"  # the sealer Job's job

# ---- the harness container: the place's own inputs
BASE_URL = "TRACEFLEET_BASE_URL"  # the proxy sidecar
API_KEY = "TRACEFLEET_API_KEY"  # the session secret the sidecar accepts
ARTIFACTS_DIR = "TRACEFLEET_ARTIFACTS_DIR"  # what the sidecar uploads when the pod stops
# Not written by the operator: an image or a test sets them.
JOB_DIR = "TRACEFLEET_JOB_DIR"  # where the plan is settled: relative task paths and `{job_dir}` (default: working directory)
WORK_DIR = "TRACEFLEET_WORK_DIR"  # where the workspace is prepared (default: working directory)

# ---- the proxy sidecar (its plan: files in PLAN_DIR, as a session's)
SESSION_SECRET = "TRACEFLEET_SESSION_SECRET"  # the secret its one session's harness presents
# The inference engine's API key (spec.inference.{managed,external}.apiKeySecretRef), sent by the proxy as
# `Authorization: Bearer`. The operator sets it from the Secret (valueFrom), never as a value.
ENGINE_API_KEY = "TRACEFLEET_ENGINE_API_KEY"

# ---- the sealer Job
BATCH_SEQ = "TRACEFLEET_BATCH_SEQ"
SESSIONS = "TRACEFLEET_SESSIONS"

# ---- a task's own image (Harbor tasks; the shared volume's layout is tracefleet.contract.task_image)
LAUNCH_DIR = "TRACEFLEET_LAUNCH_DIR"  # session container: launch the harness in the task container through here
TASK_WORKDIR = "TRACEFLEET_TASK_WORKDIR"  # task.toml's [environment].workdir (unset: the image's WORKDIR)
VERIFIER_TIMEOUT_S = "TRACEFLEET_VERIFIER_TIMEOUT_S"  # [verifier].timeout_sec, whole seconds (the task image's step)


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
Ranges = Annotated[list[int], BeforeValidator(_from_ranges), PlainSerializer(encode_ranges)]


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class PodEnv(BaseModel):
    """One container's environment: fields are aliased by their variable names. A container given a plan reads it
    from the files in the folder PLAN_DIR names (`document`: its file name, the alias of its field)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    # Where the operator sets it, for the error a pod program prints.
    container: ClassVar[str] = "pod"
    document: ClassVar[str | None] = None

    plan_dir: str | None = Field(default=None, alias=PLAN_DIR)

    def to_env(self) -> dict[str, str]:
        """The variables, as the operator writes them into the container spec; unset ones left out."""
        return {name: _text(v) for name, v in self.model_dump(by_alias=True, exclude_none=True).items()
                if name != self.document}

    def plan_parts(self) -> dict[str, str]:
        """The plan's files, by name, as the operator writes them into the folder PLAN_DIR names."""
        assert self.document is not None, f"{type(self).__name__} has no plan"
        return split_parts(self.document, self.model_dump(by_alias=True)[self.document])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Read from `env` (default: this process's environment) and the plan's files; a missing or invalid
        variable or plan is a PodEnvError whose one-line message names it."""
        env = os.environ if env is None else env
        names = {f.alias for f in cls.model_fields.values()}
        values = {k: v for k, v in env.items() if k in names and v != ""}
        if cls.document is not None:
            folder = values.get(PLAN_DIR) or PLAN_FOLDER
            try:
                values[cls.document] = read_parts(Path(folder), cls.document)
            except OSError as exc:
                raise PodEnvError(f"{PLAN_DIR}={folder}: the plan cannot be read: {exc} "
                                  f"(the operator mounts it on the {cls.container})") from None
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise PodEnvError(cls._problem(exc, env)) from None

    @classmethod
    def _problem(cls, exc: ValidationError, env: Mapping[str, str]) -> str:
        err = exc.errors(include_url=False)[0]
        where = f"(the operator sets it on the {cls.container})"
        if not err["loc"]:  # a rule across variables
            return f"{err['msg'].removeprefix('Value error, ')} (the operator sets these on the {cls.container})"
        name = str(err["loc"][0])
        if name == cls.document:  # the plan's files
            name = f"the plan in {env.get(PLAN_DIR) or PLAN_FOLDER}"
            inner = ".".join(map(str, err["loc"][1:]))
            return f"{name}: {inner + ': ' if inner else ''}{err['msg'].removeprefix('Value error, ')} {where}"
        if len(err["loc"]) > 1:  # inside a JSON value: where in it, not the whole value
            inner = ".".join(map(str, err["loc"][1:]))
            return f"{name}: {inner}: {err['msg'].removeprefix('Value error, ')} {where}"
        if err["type"] == "missing":
            return f"{name} is not set {where}"
        return f"{name}={env.get(name, '')!r} is invalid: {err['msg'].removeprefix('Value error, ')} {where}"


class BucketEnv(PodEnv):
    bucket: str = Field(alias=BUCKET)
    endpoint: str | None = Field(default=None, alias=AWS_ENDPOINT_URL)


def _plan_json(plan: Any) -> str:
    return plan.model_dump_json(by_alias=True)


def _known_fields(model: type[BaseModel]) -> Any:
    """A plan's JSON, refused when it names a field this image's `model` lacks (an operator newer than its images):
    dropping the field would run something other than what was planned."""

    def check(value: Any) -> Any:
        value = _from_json(value)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                known = {n for name, f in model.model_fields.items() for n in (name, f.alias) if n}
                if unknown := sorted(set(item) - known):
                    raise ValueError(f"{', '.join(unknown)}: not in this image's {model.__name__} (the operator is newer "
                                     "than the image: run the images of the operator's version)")
        return value

    return BeforeValidator(check)


# A plan as JSON, validated with the model the operator wrote it with; every default written out, so a pod whose image
# has other defaults still runs what the operator planned.
PlanJson = Annotated[SessionPlan, _known_fields(SessionPlan), PlainSerializer(_plan_json)]
SidecarPlanJson = Annotated[SidecarPlan, BeforeValidator(_from_json), PlainSerializer(_plan_json)]
PlansJson = Annotated[list[SessionPlan], _known_fields(SessionPlan),
                      PlainSerializer(lambda plans: "[" + ",".join(map(_plan_json, plans)) + "]")]


class HarnessEnv(PodEnv):
    """The harness container (and a task-image pod's session container): the plan, and the place's own inputs."""

    container: ClassVar[str] = "harness container"
    document: ClassVar[str | None] = SESSION_PLAN

    plan: PlanJson = Field(alias=SESSION_PLAN)
    base_url: str = Field(alias=BASE_URL)
    api_key: str = Field(alias=API_KEY)
    artifacts_dir: str = Field(default="/artifacts", alias=ARTIFACTS_DIR)
    job_dir: str | None = Field(default=None, alias=JOB_DIR)
    work_dir: str | None = Field(default=None, alias=WORK_DIR)
    # set in a Harbor task's pod: the harness runs in the task container, launched through this folder
    launch_dir: str | None = Field(default=None, alias=LAUNCH_DIR)


class ProxySidecarEnv(PodEnv):
    """The harness pod's proxy sidecar (`tracefleet proxy --in-pod`): the job's proxy and its session, planned
    (tracefleet.contract.proxy_plan.SidecarPlan), and the session's secret; its flags are its place's own."""

    container: ClassVar[str] = "proxy sidecar"
    document: ClassVar[str | None] = SIDECAR_PLAN

    plan: SidecarPlanJson = Field(alias=SIDECAR_PLAN)
    session_secret: str = Field(alias=SESSION_SECRET)
    endpoint: str | None = Field(default=None, alias=AWS_ENDPOINT_URL)


class EvaluatorEnv(BucketEnv):
    """The evaluator Job (every step of a Harbor task's): the judged session's plan (a Harbor task's names its source,
    where the fetch step reads the task's tests/) and the bucket."""

    container: ClassVar[str] = "evaluator Job"
    document: ClassVar[str | None] = SESSION_PLAN

    plan: PlanJson = Field(alias=SESSION_PLAN)

    @property
    def session_uri(self) -> str:
        """The session's folder in the bucket: what the sidecar uploaded, where reward.json goes."""
        return session_uri(self.bucket, self.plan.job, self.plan.index)


class SealerEnv(BucketEnv):
    container: ClassVar[str] = "sealer Job"
    document: ClassVar[str | None] = SESSION_PLANS

    job: str = Field(alias=JOB)
    batch_seq: int = Field(ge=0, alias=BATCH_SEQ)
    sessions: Ranges = Field(alias=SESSIONS)
    plans: PlansJson = Field(alias=SESSION_PLANS)  # the sessions' plans, each task by its id and metadata

    @model_validator(mode="after")
    def _plans_are_the_sessions(self) -> Self:
        if sorted(p.index for p in self.plans) != sorted(self.sessions):
            raise ValueError(f"the plans are of sessions {encode_ranges([p.index for p in self.plans])}, "
                             f"{SESSIONS} names {encode_ranges(self.sessions)}")
        if any(p.job != self.job for p in self.plans):
            raise ValueError(f"the plans are of sessions of another job than {JOB}={self.job}")
        return self
