"""What a job decides about its proxy, planned once (design §2.10) by tracefleet.contract.plan.plan_proxy in either
driver: `tracefleet run` hands it to its in-process proxy, the operator to each harness pod's sidecar whole (with the
pod's one session: SidecarPlan), as a file beside the session's plan (tracefleet.contract.plan_files). What stays a
flag of `tracefleet proxy` in a pod is its place's own: where it listens, its folders; its session secret is a
variable (tracefleet.contract.podenv.ProxySidecarEnv).

Unknown fields are refused, so a sidecar image older than its operator says which field it does not know instead of
dropping it; plans ship with every default written out (tracefleet.contract.podenv), so an image whose defaults differ
still runs what the operator planned.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tracefleet.contract.engine_limits import EngineLimits, StatedLogprobsMode
from tracefleet.contract.sampling import SamplingOverride

CaptureMode = Literal["auto", "server", "exact"]


class ProxyPlan(BaseModel):
    """The proxy's configuration as the job states it (spec.inference): the same for every session of the job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine_url: str  # the engine's root URL (no /v1)
    # exact: the proxy renders and splices served ids (refuses to start when it cannot); server: the engine renders;
    # auto: exact where the model's family is supported (tracefleet.proxy.mode)
    mode: CaptureMode = "auto"
    served_model: str | None = None  # the name harness calls go out under; None: the first the engine lists
    # exact mode's tokenizer and chat template: a shipped model name, a .gguf, a model directory or a hub id in the
    # local cache; None: the served model's, else the engine's own `root` (tracefleet.proxy.mode.engine_named_model)
    tokenizer: str | None = None
    model_family: str | None = None
    tool_parser: str | None = None
    engine_limits: EngineLimits = Field(default_factory=EngineLimits)
    # the kind of logprobs the engine reports, as stated; None: asked of the engine, else recorded as unknown
    logprobs_mode: StatedLogprobsMode | None = None
    sampling: SamplingOverride = Field(default_factory=SamplingOverride)
    policy_version: int = Field(default=0, ge=0)


class SidecarPlan(BaseModel):
    """A harness pod's proxy sidecar: the job's ProxyPlan, the one session it serves and where its capture goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    proxy: ProxyPlan
    session_id: str
    upload_to: str  # the session's folder in the bucket (tracefleet.contract.layout.session_uri)
