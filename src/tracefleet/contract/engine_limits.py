"""What the proxy is told about its engine: how long it waits for it, and what kind of logprobs it reports. The job's
proxy plan carries them (tracefleet.contract.proxy_plan, for a sidecar and `tracefleet run`'s in-process proxy);
`tracefleet proxy` takes them as flags with these names and defaults.

Time limits, each for what it says (a streamed call that keeps producing tokens is never cut by them):
- connect: opening a connection to the engine;
- first token: from sending a request to the first bytes of its answer (a streamed answer's first chunk comes with
  its first token; a non-streamed answer arrives whole, so for it this bounds the whole answer);
- inter token: between two reads of a streamed answer (an engine that stalls: a dead worker, a pause that never
  resumes);
- total: the whole call; off unless set (a long reasoning answer at 50 tokens/s runs for many minutes).

Logprobs kind: vLLM's `--logprobs-mode`. `processed_logprobs` are the logprobs of the distribution that sampled
(after temperature and top-k/top-p): the behaviour policy. `raw_logprobs` (vLLM's default) are the model's
unscaled distribution's, whatever the sampling parameters; a trainer must not use them as behaviour logprobs
unless it corrects for that. `unknown`: neither the engine nor the user said.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CONNECT_S = 10.0
FIRST_TOKEN_S = 600.0  # a long prompt's prefill behind a full queue
INTER_TOKEN_S = 300.0  # longer than any decode step; a weight sync that keeps calls paused may need more

PROCESSED_LOGPROBS = "processed_logprobs"
RAW_LOGPROBS = "raw_logprobs"
UNKNOWN_LOGPROBS = "unknown"
LogprobsMode = Literal["processed_logprobs", "raw_logprobs", "unknown"]
StatedLogprobsMode = Literal["processed_logprobs", "raw_logprobs"]
LOGPROBS_MODES: tuple[str, ...] = (PROCESSED_LOGPROBS, RAW_LOGPROBS)
LOGPROBS_MODE = PROCESSED_LOGPROBS  # what tracefleet starts vLLM with (tracefleet.vllm): the behaviour policy's

# the limit a cut call records (CallError.limit)
Limit = Literal["connect", "first_token", "inter_token", "total"]

# `tracefleet proxy` flags (and `tracefleet run`'s, which override the job's)
CONNECT_FLAG = "--engine-connect-timeout-s"
FIRST_TOKEN_FLAG = "--engine-first-token-timeout-s"
INTER_TOKEN_FLAG = "--engine-inter-token-timeout-s"
TOTAL_FLAG = "--engine-total-timeout-s"
LOGPROBS_MODE_FLAG = "--logprobs-mode"
LIMIT_FLAGS: dict[str, str] = {"connect": CONNECT_FLAG, "first_token": FIRST_TOKEN_FLAG,
                               "inter_token": INTER_TOKEN_FLAG, "total": TOTAL_FLAG}


class EngineLimits(BaseModel):
    """The proxy's time limits on engine requests, in seconds (None: no total limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_s: float = Field(default=CONNECT_S, gt=0)
    first_token_s: float = Field(default=FIRST_TOKEN_S, gt=0)
    inter_token_s: float = Field(default=INTER_TOKEN_S, gt=0)
    total_s: float | None = Field(default=None, gt=0)


def arg_value(args: list[str], flag: str) -> str | None:
    """The value of `flag V` / `flag=V` in an argument list, the last one winning (as in vLLM's own parser)."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.partition("=")[2]
    return value


def logprobs_mode_of(extra_args: list[str]) -> str:
    """The `--logprobs-mode` a managed vLLM runs with: LOGPROBS_MODE unless extraArgs override it."""
    return arg_value(list(extra_args), "--logprobs-mode") or LOGPROBS_MODE
