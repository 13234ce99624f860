"""The trace schema (version `TRACE_SCHEMA_VERSION`).

A trace is one causal token stream, held columnar (numpy) because traces are long:

- `tokens` int32[n]: every token the sampled tokens were conditioned on, in order, then the samples.
- `loss_mask` uint8[n]: 1 = sampled by the policy (trainable), 0 = context (prompt, tool output, ...).
- `logprobs` float32[n]: the engine's logprob of each sampled token. Masked positions hold NaN in
  memory and are **null** in Parquet (never 0.0, which would be a real logprob). The torch reader turns
  them into 0.0 under a zero `loss_mask`.
- `spans`: one per call the policy sampled in the trace (a guided call, answered by the session's guide, has
  none: its tokens are context), in order: `call_id`, `prompt_start` (where the tokens this call
  added to the prompt begin, a guided call's among them), `completion_start`, `completion_end` (the sampled span), `policy_version`
  (the policy that sampled that span), `finish_reason`, the sampling parameters sent (`temperature`,
  `top_p`, `top_k`; null = the engine's default) and `logprobs_mode`, what the span's logprobs are
  (`processed_logprobs`: the sampling distribution's, behaviour logprobs; `raw_logprobs`: before temperature
  and top-k/top-p; `unknown`; null in traces built before it was recorded). These are the turn boundaries.
- `meta`: `TraceMetadata` (job, session, task, group, sample index, harness, model, tokenizer, reward,
  outcome, finish reasons, timings, the session's reconstruction stats, ...).

Token fidelity, checked by the tests: `tokens[loss_mask == 1]` and `logprobs[loss_mask == 1]`
are exactly the capture log's `completion_ids` and `logprobs` of the trace's calls the policy sampled (not the
guided ones), concatenated in span order, and the tokens before each span are exactly that call's `prompt_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from tracefleet.contract.batch import TRACE_SCHEMA_VERSION
from tracefleet.contract.semantics import OutcomeKind

from tracefleet.traces.versions import token_versions

Outcome = Literal["ok", "fail_closed"]
BuilderName = Literal["per-request", "prefix-merge"]


class Span(BaseModel):
    call_id: str
    prompt_start: int
    completion_start: int
    completion_end: int
    policy_version: int
    finish_reason: str | None = None
    # the sampling parameters the proxy sent for this call; None = the engine's default (vLLM: the model's
    # generation_config.json)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    # what the span's logprobs are, as its capture record says: processed_logprobs are the behaviour policy's
    # (tracefleet runs vLLM with --logprobs-mode processed_logprobs); raw_logprobs (vLLM's default) are taken
    # before temperature/top-k/top-p, and the reader refuses them as behaviour logprobs unless told
    logprobs_mode: str | None = None


class ReconstructionStats(BaseModel):
    """What the builder did with one session's calls. `dropped` maps a reason to a count."""

    builder: str = "prefix-merge"
    calls: int = 0  # records in the capture log
    answered_calls: int = 0  # of those, calls the engine answered (not failed): the policy acted in the session
    kept_calls: int = 0  # calls that are trained on (ok, non-empty, consistent)
    traces: int = 0
    merged_calls: int = 0  # calls appended to an earlier call's trace (prefix extension)
    new_roots: dict[str, int] = Field(default_factory=dict)  # why a call started a new trace
    drift_splits: int = 0  # server mode: the prompt did not extend the parent's prompt + completion
    retries: int = 0  # calls whose prompt equals an earlier call's prompt (siblings)
    branches: int = 0  # calls that extend a call which already had a continuation (own trace)
    ambiguous: int = 0  # two or more exact candidate parents: not guessed, new trace
    ambiguous_calls: list[dict[str, Any]] = Field(default_factory=list)
    dropped: dict[str, int] = Field(default_factory=dict)
    tokens: int = 0  # tokens over all traces
    trainable_tokens: int = 0
    capture_tokens: int = 0  # prompt + completion tokens over all kept calls (what the builder read)
    torn_tail: bool = False
    bad_lines: int = 0
    tool_parse_errors: int = 0


class Timing(BaseModel):
    started_at: float | None = None  # first call received
    finished_at: float | None = None  # last call done
    engine_seconds: float = 0.0  # sum over calls of done_at - engine_sent_at
    ttft_seconds: list[float] = Field(default_factory=list)  # per call, in span order


class TraceMetadata(BaseModel):
    schema_version: int = TRACE_SCHEMA_VERSION
    trace_id: str
    job: str | None = None
    session_id: str
    task_id: str | None = None
    group_id: str | None = None  # GRPO group: the task's samples share it
    sample_index: int | None = None
    harness: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    builder: str = "prefix-merge"
    reward: float | None = None  # after the fail-closed rules
    evaluator_reward: float | None = None  # what the evaluator said
    outcome: Outcome = "ok"
    fail_closed_reasons: list[str] = Field(default_factory=list)
    # whose outcome the row is (tracefleet.contract.semantics.outcome_kind over fail_closed_reasons): infrastructure
    # rows are left out of training by default (BatchReader)
    outcome_kind: OutcomeKind = OutcomeKind.OK
    finish_reasons: list[str | None] = Field(default_factory=list)
    branch_of: str | None = None  # call id this trace's first call branched from (retry / parallel branch)
    new_root_reason: str | None = None
    timings: Timing = Field(default_factory=Timing)
    stats: ReconstructionStats = Field(default_factory=ReconstructionStats)
    # the session's diagnostic findings (tracefleet.diagnostics.base.Finding as JSON) and whether they
    # quarantine it (reward forced to <= 0; the reader leaves it out of training by default)
    diagnostics: list[dict[str, Any]] = Field(default_factory=list)
    quarantined: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)


@dataclass(eq=False)  # arrays: compare fields explicitly
class Trace:
    tokens: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    logprobs: np.ndarray  # float32, NaN where loss_mask == 0
    spans: list[Span]
    meta: TraceMetadata
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_trainable(self) -> int:
        return int(sum(s.completion_end - s.completion_start for s in self.spans))

    @property
    def call_ids(self) -> list[str]:
        return list(dict.fromkeys(s.call_id for s in self.spans))  # a call that straddled an update has 2+ spans

    def token_versions(self) -> np.ndarray:
        """int32[n]: the policy version that sampled each token, -1 where none did (traces.versions)."""
        return token_versions((s.model_dump() for s in self.spans), self.num_tokens)

    @property
    def policy_versions(self) -> list[int]:
        return [s.policy_version for s in self.spans]


class SessionInfo(BaseModel):
    """What the runner knows about a session besides its capture log (all optional)."""

    job: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    group_id: str | None = None
    sample_index: int | None = None
    harness: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    reward: float | None = None
    evaluator_status: Literal["ok", "error", "timeout", "unavailable", "missing"] = "ok"
    capture_complete: bool = True  # the runner saw the proxy close the session cleanly
    failure: str | None = None  # the session did not complete: `session_<status>:<stage>` (fail-closed reason)
    extra: dict[str, Any] = Field(default_factory=dict)


class BuildResult(BaseModel):
    model_config = {"arbitrary_types_allowed": True}

    traces: list[Any]  # list[Trace]
    stats: ReconstructionStats
    outcome: Outcome = "ok"
    fail_closed_reasons: list[str] = Field(default_factory=list)
