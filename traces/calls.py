"""Capture records as numpy arrays, and the decision which calls may be trained on.

The builders work on `Call` (token ids and logprobs as numpy arrays) so that they never loop over tokens
in Python. A call is kept only if it completed and its record is self-consistent; every other call is
dropped with a reason that ends up in the session's stats (never silently).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracefleet.contract.capture import CaptureRecord
from tracefleet.contract.policy import policy_spans


@dataclass
class Call:
    index: int  # position in the capture log
    call_id: str
    prompt: np.ndarray  # int32
    completion: np.ndarray  # int32
    logprobs: np.ndarray  # float32, one per completion token
    policy_version: int = 0  # the version that sampled its first token
    finish_reason: str | None = None
    # [(policy version, start, end)] over the completion: more than one when the call straddled an update
    version_spans: tuple[tuple[int, int, int], ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature / top_p / top_k as sent (absent: engine default)
    logprobs_mode: str | None = None  # processed_logprobs | raw_logprobs | unknown (None: not recorded)
    flags: tuple[str, ...] = ()
    guided: bool = False  # answered by the session's guide, not sampled by the policy: context, never trained
    status: str = "ok"
    error_kind: str | None = None
    mode: str = "server"
    hint_parent: str | None = None  # splice.parent_call_id: the proxy's (message-level) idea of the parent
    drift: bool = False
    new_root_reason: str | None = None
    tool_parse_errors: int = 0
    offers_tools: bool = False  # the request offered the model tools (the agent's conversation does)
    received_at: float | None = None
    engine_sent_at: float | None = None
    first_token_at: float | None = None
    done_at: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def full_len(self) -> int:
        return int(self.prompt.shape[0] + self.completion.shape[0])


def call_from_record(record: CaptureRecord, index: int) -> Call:
    splice = record.splice
    versions = policy_spans(record.weight_versions, record.policy_version, len(record.completion_ids))
    return Call(
        index=index,
        call_id=record.call_id,
        prompt=np.asarray(record.prompt_ids, dtype=np.int32),
        completion=np.asarray(record.completion_ids, dtype=np.int32),
        logprobs=np.asarray(record.logprobs, dtype=np.float32),
        policy_version=versions[0][0] if versions else record.policy_version,
        version_spans=tuple(versions),
        finish_reason=record.finish_reason,
        sampling={k: v.get("value") for k, v in (record.sampling or {}).items() if isinstance(v, dict)},
        logprobs_mode=record.logprobs_mode,
        flags=tuple(record.flags),
        guided=record.guided,
        status=record.status,
        error_kind=record.error.kind if record.error else None,
        mode=record.mode,
        hint_parent=splice.parent_call_id if splice else None,
        drift=bool(splice.drift) if splice else False,
        new_root_reason=splice.new_root_reason if splice else None,
        tool_parse_errors=len(record.tool_parse_errors),
        offers_tools=bool((record.canonical or {}).get("tools")),
        received_at=record.timings.received_at,
        engine_sent_at=record.timings.engine_sent_at,
        first_token_at=record.timings.first_token_at,
        done_at=record.timings.done_at,
    )


def calls_from_records(records: Iterable[CaptureRecord]) -> list[Call]:
    return [call_from_record(r, i) for i, r in enumerate(records)]


def drop_reason(call: Call) -> str | None:
    """Why this call must not be trained on, or None. Failed and partial calls never are."""
    if call.status == "error":
        return f"error:{call.error_kind or 'unknown'}"
    if call.status == "partial":
        return "partial"
    if call.status != "ok":
        return f"status:{call.status}"
    if call.completion.shape[0] == 0:
        return "empty_completion"
    if call.prompt.shape[0] == 0:
        return "empty_prompt"
    if call.logprobs.shape[0] != call.completion.shape[0]:
        return "logprobs_mismatch"
    if call.flags:  # e.g. token_count_mismatch: the engine sampled tokens the record does not hold
        return f"flagged:{call.flags[0]}"
    if not bool(np.isfinite(call.logprobs).all()) or bool((call.logprobs > 0).any()):
        return "logprobs_invalid"
    return None


def split_kept(calls: Sequence[Call]) -> tuple[list[Call], dict[str, int], dict[str, str]]:
    """(kept calls, dropped reason -> count, dropped call id -> reason)."""
    kept: list[Call] = []
    counts: dict[str, int] = {}
    dropped_ids: dict[str, str] = {}
    for call in calls:
        reason = drop_reason(call)
        if reason is None:
            kept.append(call)
        else:
            counts[reason] = counts.get(reason, 0) + 1
            dropped_ids[call.call_id] = reason
    return kept, counts, dropped_ids


def engine_seconds(call: Call) -> float:
    if call.done_at is None:
        return 0.0
    start = call.engine_sent_at if call.engine_sent_at is not None else call.received_at
    value = call.done_at - (start or call.done_at)
    return value if math.isfinite(value) and value > 0 else 0.0
