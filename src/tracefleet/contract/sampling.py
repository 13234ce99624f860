"""The sampling a job states for every call of its sessions (`spec.inference.sampling`): the rollout's behaviour
policy. A harness decides its own sampling (most coding CLIs send none, so the engine's defaults apply), and an RL
run needs to choose it: each parameter the job sets replaces the harness's value on every call the proxy sends to
the engine, and is recorded with source `job` (the capture record's `sampling`, each trace span's temperature,
top_p and top_k), so a trainer scores each token under the distribution that sampled it. The job's proxy plan carries
it (tracefleet.contract.proxy_plan: a sidecar's, `tracefleet run`'s in-process proxy's); `tracefleet proxy` takes
it as these flags.

Why the proxy and not the engine's own defaults (vLLM `--override-generation-config`): a value the request does not
carry is recorded as the engine's default, unknown to the trace, and a trainer that assumes temperature 1 would
score every token under the wrong distribution.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# the source a capture record gives a sampling parameter the job set (beside request | proxy | engine_default)
JOB_SOURCE = "job"

# `tracefleet proxy` flags
TEMPERATURE_FLAG = "--temperature"
TOP_P_FLAG = "--top-p"
TOP_K_FLAG = "--top-k"


class SamplingOverride(BaseModel):
    """The sampling parameters that replace a harness's on every call (None: the harness's own, else the
    engine's default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)

    def fields(self) -> dict[str, Any]:
        """The engine request fields these set."""
        return {key: value for key, value in self.model_dump().items() if value is not None}
