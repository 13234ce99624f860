"""Harbor task folders, read without Harbor: task.toml as pydantic models, the folder's file names, the paths
Harbor's verifier contract uses inside the container, and the verifier's verdict.

A Harbor task is a folder (harbor/models/task/paths.py in the `harbor` wheel, 0.26.0):

    task.toml        schema_version "1.x"; [metadata]; [verifier] timeout_sec; [agent] timeout_sec;
                     [environment] build_timeout_sec, docker_image, cpus, memory_mb, storage_mb, gpus,
                     network_mode, allowed_hosts
    instruction.md   what the agent is asked
    environment/     a Dockerfile and its build context (or task.toml names a prebuilt docker_image)
    tests/test.sh    copied to /tests and run from the working directory; writes /logs/verifier/reward.txt
                     (one number) or /logs/verifier/reward.json (named metrics)
    solution/        the reference solution (solve.sh): never shown to the agent

The models follow Harbor's own TaskConfig (harbor/models/task/config.py) field for field for what tracefleet
reads, with Harbor's leniency: unknown keys are ignored and numbers may be given as strings, so a folder Harbor
accepts is one we accept. Where we are stricter, on purpose:
  - schema_version must be 1.x (Harbor's model takes any string; a 2.x folder is a format we cannot promise
    to read right);
  - timeouts must be positive (Harbor takes 0 or a negative number and then times out at once);
  - multi-step tasks ([[steps]]) are refused: one session answers one instruction.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# ------------------------------------------------------------------ the folder

TASK_CONFIG = "task.toml"
INSTRUCTION = "instruction.md"
ENVIRONMENT_DIR = "environment"
DOCKERFILE = "Dockerfile"
TESTS_DIR = "tests"
TEST_SCRIPT = "test.sh"
SOLUTION_DIR = "solution"
SOLVE_SCRIPT = "solve.sh"

SUPPORTED_SCHEMA_MAJOR = 1
DEFAULT_SCHEMA_VERSION = "1.4"  # what Harbor 0.26 writes and assumes when task.toml names none

# ------------------------------------------------------------------ inside the container (Harbor's verifier)

CONTAINER_TESTS_DIR = "/tests"
CONTAINER_VERIFIER_LOGS = "/logs/verifier"
REWARD_TXT = "reward.txt"
REWARD_JSON = "reward.json"
# The metric of reward.json that is the training reward: Harbor's one-dimensional convention (a step's
# `min_reward` given as a number gates on this key). reward.txt's one number is this metric too.
TRAINING_REWARD_KEY = "reward"

# The Kubernetes driver refuses a job with Harbor tasks in these words until its sessions run in their task's image
# (`tracefleet run` runs them: tracefleet.runner.containers.place).
HARBOR_NOT_YET = ("spec.tasks.harbor: Harbor task folders do not run in a job yet (sessions in their task's own image "
                  "come next); `tracefleet validate` checks them and `tracefleet tasks build` builds their images")

NetworkMode = Literal["no-network", "public", "allowlist"]
PUBLIC_NETWORK: NetworkMode = "public"  # the internet: a runtime's bridge network locally, an egress policy on a cluster
# What a phase gets when task.toml names no network_mode anywhere: Harbor's default is "public"; tracefleet's is no
# network (an agent under training reaches the proxy and nothing else unless its task says otherwise).
DEFAULT_NETWORK: NetworkMode = "no-network"
ALLOWED_HOSTS_MESSAGE = "allowed_hosts is only valid when network_mode='allowlist'"


class HarborModel(BaseModel):
    # Harbor's models are pydantic defaults: unknown keys ignored, "900" read as 900.0. Same verdicts here.
    model_config = ConfigDict(extra="ignore")


def _check_network(mode: str | None, hosts: list[str] | None) -> None:
    if hosts and mode != "allowlist":
        raise ValueError(ALLOWED_HOSTS_MESSAGE)


def _positive(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive number of seconds, got {value}")
    return value


class PhaseConfig(HarborModel):
    """[agent] and [verifier]: a phase may narrow the environment's network."""

    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    user: str | int | None = None

    @model_validator(mode="after")
    def _network(self) -> "PhaseConfig":
        _check_network(self.network_mode, self.allowed_hosts)
        return self


class VerifierConfig(PhaseConfig):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    # Harbor's separate verifier environment (a container of its own, fed declared artifacts): read so that a task
    # asking for it is refused in one line (tracefleet.harbor.folders), never judged the shared way by mistake.
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None

    @property
    def separate(self) -> bool:
        return self.environment_mode == "separate" or (self.environment is not None and self.environment_mode is None)

    positive_timeout = field_validator("timeout_sec")(_positive)


class AgentConfig(PhaseConfig):
    timeout_sec: float | None = None

    positive_timeout = field_validator("timeout_sec")(_positive)


def _size_mb(text: str) -> int:
    """Harbor's legacy `memory`/`storage` strings ("2G", "512M") in MB, as Harbor converts them."""
    size = text.strip().upper()
    units = {"G": 1024, "M": 1, "K": 1 / 1024}
    if size[-1:] not in units:
        raise ValueError(f"invalid size {text!r}: expected a number with G, M or K, e.g. '2G' or '512M'")
    return int(float(size[:-1]) * units[size[-1]])


class EnvironmentConfig(HarborModel):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: int | float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    gpu_types: list[str] | None = None
    network_mode: NetworkMode = PUBLIC_NETWORK
    allowed_hosts: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None

    positive_timeout = field_validator("build_timeout_sec")(_positive)

    @field_validator("os", mode="before")
    @classmethod
    def _lower_os(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        # Older task.toml files: `memory = "2G"`, `storage = "10G"`, `allow_internet = false` (Harbor maps them).
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if isinstance(data.get(old), str):
                data.setdefault(new, _size_mb(data.pop(old)))
            data.pop(old, None)
        allow = data.pop("allow_internet", None)
        if allow is not None and "network_mode" not in data and data.get("allowed_hosts") is None:
            data["network_mode"] = PUBLIC_NETWORK if allow else "no-network"
        return data

    @model_validator(mode="after")
    def _network(self) -> "EnvironmentConfig":
        _check_network(self.network_mode, self.allowed_hosts)
        return self

    def baseline_network(self) -> NetworkMode:
        """network_mode as task.toml states it (legacy allow_internet included), else DEFAULT_NETWORK: the models
        read a folder as Harbor does ("public" when unstated); what a session gets is decided here."""
        return self.network_mode if "network_mode" in self.model_fields_set else DEFAULT_NETWORK

    def resource_quantities(self) -> dict[str, int | str]:
        """The task's resources as Kubernetes quantities (requests = limits: a task states what it needs)."""
        out: dict[str, int | str] = {}
        if self.cpus is not None:
            out["cpu"] = self.cpus if isinstance(self.cpus, int) else f"{round(self.cpus * 1000)}m"
        if self.memory_mb is not None:
            out["memory"] = f"{self.memory_mb}Mi"
        if self.storage_mb is not None:
            out["ephemeral-storage"] = f"{self.storage_mb}Mi"
        if self.gpus:
            out["nvidia.com/gpu"] = self.gpus
        return out


class TaskConfig(HarborModel):
    """task.toml."""

    schema_version: str = DEFAULT_SCHEMA_VERSION
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    source: str | None = None
    steps: list[dict[str, Any]] | None = None

    def network(self, phase: Literal["agent", "verifier"]) -> NetworkMode:
        """The network a phase runs with: its own network_mode, else the environment's baseline (Harbor's order)."""
        return getattr(self, phase).network_mode or self.environment.baseline_network()

    @model_validator(mode="before")
    @classmethod
    def _version_rename(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:  # Harbor's older name for schema_version
            data = dict(data)
            data.setdefault("schema_version", data.pop("version"))
        return data

    @field_validator("schema_version", mode="before")
    @classmethod
    def _supported(cls, value: Any) -> Any:
        major = str(value).split(".", 1)[0]
        if not (major.isdigit() and int(major) == SUPPORTED_SCHEMA_MAJOR):
            raise ValueError(f"unsupported schema_version {value!r}: tracefleet reads Harbor task folders "
                             f"{SUPPORTED_SCHEMA_MAJOR}.x")
        return str(value)

    @field_validator("steps")
    @classmethod
    def _single_step(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value:
            raise ValueError("multi-step tasks ([[steps]]) are not supported: one session answers one instruction")
        return value


# ------------------------------------------------------------------ the verifier's verdict

VerdictStatus = Literal["ok", "no_reward", "unreadable_reward", "timeout", "error"]


class HarborVerdict(BaseModel):
    """What the Harbor verifier made of one session. Fail-closed (status other than "ok"): reward 0.0 and
    `reason` says why in one line; `metrics` keeps every named metric the tests wrote even then (a reward.json
    without a `reward` key is fail-closed but its metrics are not lost)."""

    model_config = ConfigDict(extra="forbid")

    status: VerdictStatus
    reward: float = Field(description=f"The training reward: reward.txt's number, or reward.json's "
                                      f"{TRAINING_REWARD_KEY!r} metric; 0.0 when fail-closed.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Every metric the tests wrote.")
    reward_file: Literal["reward.txt", "reward.json"] | None = None
    reason: str | None = None
    exit_code: int | None = Field(default=None, description="test.sh's exit status (None when it was killed).")
    duration_s: float = 0.0
    output_tail: str = Field(default="", description="The end of test.sh's stdout and stderr.")

    @property
    def failed_closed(self) -> bool:
        return self.status != "ok"


# ------------------------------------------------------------------ a Harbor task in a session plan


class HarborTaskRun(BaseModel):
    """How a session of a Harbor task runs (SessionPlan.task.harbor): the task folder (its tests/ and task.toml, read
    again by the verifier), the image its sessions run in and the working directory there. `refusal` (one line) when
    the task cannot run here (a folder with problems, an image that did not build, no container runtime): its
    sessions then fail at `prepare` with it, fail-closed rows of the batch, and the job goes on."""

    model_config = ConfigDict(extra="forbid")

    folder: str
    image: str | None = None
    workdir: str | None = Field(default=None, description="task.toml's [environment].workdir, else the image's WORKDIR.")
    refusal: str | None = None
    agent_timeout_s: float | None = Field(default=None, description="[agent].timeout_sec: the harness's time limit "
                                                                     "when shorter than the job's.")
    verifier_timeout_s: float | None = Field(default=None, description="[verifier].timeout_sec: test.sh's time limit.")
