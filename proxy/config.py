"""Proxy configuration: what the job planned (tracefleet.contract.proxy_plan.ProxyPlan) and the place's own inputs
(where it keeps captures, its admin token, its sessions). `tracefleet proxy` makes the plan from its flags, or takes
it whole in a pod (`--in-pod`); `tracefleet run` takes it from the planner."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tracefleet.contract.engine_limits import EngineLimits, StatedLogprobsMode
from tracefleet.contract.proxy_plan import ProxyPlan
from tracefleet.contract.sampling import SamplingOverride


class PresetSession(BaseModel):
    """A session created at startup (sidecar mode: the runner/operator knows id and secret up front)."""

    session_id: str
    secret: str
    metadata: dict[str, str] = Field(default_factory=dict)


class ProxyConfig(BaseModel):
    engine_url: str
    capture_dir: Path
    admin_token: str
    # server: the engine renders prompts; exact: the proxy renders and splices served ids (fails to start
    # when it cannot); auto: exact where the model's family is supported, server otherwise (proxy/mode.py)
    mode: Literal["auto", "server", "exact"] = "server"
    # exact mode: where the model's tokenizer and chat template come from (a shipped model name, a .gguf
    # file, a Hugging Face model directory or a hub id in the local HF cache; never downloaded), and
    # optional family/parser overrides
    model_path: str | None = None
    model_family: str | None = None
    tool_parser: str | None = None
    chat_template_file: Path | None = None
    served_model: str | None = None  # the engine's model name; None = the first one /v1/models lists
    max_body_bytes: int = 32 * 1024 * 1024  # larger requests get 413 in the dialect's shape
    inline_body_bytes: int = 4 * 1024 * 1024  # larger bodies are written next to the log, not inlined
    # sent as `Authorization: Bearer` on every engine call (vLLM --api-key; RolloutJob apiKeySecretRef)
    engine_api_key: str | None = Field(default=None, repr=False)
    engine_limits: EngineLimits = Field(default_factory=EngineLimits)  # connect / first token / inter token / total
    # what kind of logprobs the engine reports, as stated (a managed engine's from its args, an external one's by
    # the user); None: asked of the engine (its /v1/models card), else recorded as unknown
    logprobs_mode: StatedLogprobsMode | None = None
    # the job's sampling: each parameter set replaces the harness's on every call (spec.inference.sampling)
    sampling: SamplingOverride = Field(default_factory=SamplingOverride)
    keepalive_s: float = 10.0  # ping the harness when the engine is silent this long
    pause_max_wait_s: float = 30.0  # paused: a new call waits this long for resume, then 429
    retry_after_s: int = 5
    policy_version: int = 0
    # an engine that plays demonstrations (the scripted engine with the job's demo script, tracefleet.trainer.demos):
    # it answers the first `guided_calls` calls of a session created with them, in exact mode only; None: no session
    # may be guided. The place's (tracefleet train starts it), not the job's plan.
    guide_url: str | None = None
    sessions: list[PresetSession] = Field(default_factory=list)
    upload_to: str | None = None  # sidecar: bucket prefix (s3://... or a directory) for capture + artifacts on stop
    artifacts_dir: Path | None = None  # uploaded under <upload_to>/artifacts/

    @classmethod
    def from_plan(cls, plan: ProxyPlan, **place: Any) -> ProxyConfig:
        """The configuration of a proxy that runs `plan`; `place`: this proxy's own fields (capture_dir, admin_token,
        sessions, upload_to, ...)."""
        return cls(engine_url=plan.engine_url, mode=plan.mode, served_model=plan.served_model, model_path=plan.tokenizer,
                   model_family=plan.model_family, tool_parser=plan.tool_parser, engine_limits=plan.engine_limits,
                   logprobs_mode=plan.logprobs_mode, sampling=plan.sampling, policy_version=plan.policy_version,
                   **place)
