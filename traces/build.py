"""Capture log → traces + stats, with the fail-closed outcome rules.

    result = build_traces("capture/sess-1.jsonl", builder="prefix-merge",
                          session=SessionInfo(job="j", task_id="t", group_id="t", sample_index=0, reward=1.0))

Fail-closed: if the session did not complete (`SessionInfo.failure`), the capture is incomplete (torn last line, unparsable lines, or the runner
did not see the session close cleanly), the evaluator errored / timed out / gave no reward, or any call
carries unparsed tool calls, every trace of the session is marked `outcome="fail_closed"` with the
reasons, and its reward is clamped to `min(reward, 0)` (0 when there was none): never a positive reward.
Its `outcome_kind` says whose failure it is (tracefleet.contract.semantics.outcome_kind): the policy's, counted,
or the infrastructure's, left out of training.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tracefleet.contract.capture import CaptureLog, CaptureRecord, read_capture_log
from tracefleet.contract.semantics import (CAPTURE_BAD_LINES, CAPTURE_INCOMPLETE, CAPTURE_TORN_TAIL, EVALUATOR_REASON,
                                           REWARD_MISSING, TOOL_PARSE_ERRORS, outcome_kind)

from tracefleet.traces.calls import Call, calls_from_records, engine_seconds, split_kept
from tracefleet.traces.merge import build_tree, chains
from tracefleet.traces.schema import BuildResult, ReconstructionStats, SessionInfo, Span, Timing, Trace, TraceMetadata

BUILDERS = ("prefix-merge", "per-request")


def fail_closed_reasons(
    calls: Sequence[Call], session: SessionInfo, torn_tail: bool = False, bad_lines: int = 0
) -> list[str]:
    reasons: list[str] = []
    if session.failure:
        reasons.append(session.failure)
    if torn_tail:
        reasons.append(CAPTURE_TORN_TAIL)
    if bad_lines:
        reasons.append(CAPTURE_BAD_LINES)
    if not session.capture_complete:
        reasons.append(CAPTURE_INCOMPLETE)
    if session.evaluator_status != "ok":
        reasons.append(EVALUATOR_REASON.format(session.evaluator_status))
    elif session.reward is None:
        reasons.append(REWARD_MISSING)
    if any(c.tool_parse_errors for c in calls):
        reasons.append(TOOL_PARSE_ERRORS)
    return reasons


def _assemble(calls: Sequence[Call], chain: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Span]]:
    """One trace from a chain in which each call's prompt extends the previous call's prompt + completion.
    A call whose tokens were sampled by more than one policy version (it straddled an update) gets one span
    per version; the later ones add no prompt (prompt_start == completion_start). A guided call's completion (the
    guide's, not the policy's) is context: no span, loss mask 0, no logprobs; the next span's prompt starts at it."""
    pieces: list[np.ndarray] = []
    spans: list[Span] = []
    at = 0
    bounds: list[tuple[int, int, int]] = []  # (call index, completion start, end) in the trace
    context_from = 0  # where the next span's context begins: the end of the last span (guided calls are context)
    for idx in chain:
        call = calls[idx]
        new_prompt = call.prompt[at:]  # at == previous full length: the verified shared prefix is skipped
        pieces.append(new_prompt)
        pieces.append(call.completion)
        cs = at + new_prompt.shape[0]
        ce = cs + call.completion.shape[0]
        if call.guided:
            at = ce
            continue
        for version, start, end in call.version_spans or ((call.policy_version, 0, ce - cs),):
            spans.append(Span(call_id=call.call_id, prompt_start=context_from if start == 0 else cs + start,
                              completion_start=cs + start, completion_end=cs + end, policy_version=version,
                              finish_reason=call.finish_reason, temperature=call.sampling.get("temperature"),
                              top_p=call.sampling.get("top_p"), top_k=call.sampling.get("top_k"),
                              logprobs_mode=call.logprobs_mode))
        bounds.append((idx, cs, ce))
        at = context_from = ce
    tokens = np.concatenate(pieces).astype(np.int32, copy=False)
    mask = np.zeros(at, dtype=np.uint8)
    logprobs = np.full(at, np.nan, dtype=np.float32)
    for idx, cs, ce in bounds:
        mask[cs:ce] = 1
        logprobs[cs:ce] = calls[idx].logprobs
    return tokens, mask, logprobs, spans


def build_from_calls(
    all_calls: Sequence[Call],
    *,
    builder: str = "prefix-merge",
    session: SessionInfo | None = None,
    torn_tail: bool = False,
    bad_lines: int = 0,
) -> BuildResult:
    if builder not in BUILDERS:
        raise ValueError(f"unknown builder {builder!r}; choose one of {', '.join(BUILDERS)}")
    session = session or SessionInfo()
    stats = ReconstructionStats(builder=builder, calls=len(all_calls), torn_tail=torn_tail, bad_lines=bad_lines,
                                answered_calls=sum(1 for c in all_calls if c.status != "error"))
    stats.tool_parse_errors = sum(c.tool_parse_errors for c in all_calls)
    kept, dropped, dropped_ids = split_kept(all_calls)
    stats.dropped = dropped
    stats.kept_calls = len(kept)
    stats.capture_tokens = sum(c.full_len for c in kept)

    if builder == "per-request":
        groups: list[tuple[list[int], int]] = [([i], -1) for i in range(len(kept))]
        root_reason: list[str | None] = ["per_request"] * len(kept)
    else:
        tree = build_tree(kept, stats, dropped_ids)
        groups = chains(tree)
        root_reason = tree.root_reason
        stats.merged_calls = sum(len(chain) - 1 for chain, _ in groups)
        stats.branches = sum(1 for _, branched in groups if branched >= 0)

    reasons = fail_closed_reasons(all_calls, session, torn_tail, bad_lines)
    kind = outcome_kind(reasons, model_answered=stats.answered_calls > 0)
    reward = session.reward
    if reasons:
        reward = min(reward, 0.0) if reward is not None else 0.0
    session_id = session.session_id or (all_calls[0].extra.get("session_id") if all_calls else None) or "session"

    traces: list[Trace] = []
    for k, (chain, branched) in enumerate(groups):
        tokens, mask, logprobs, spans = _assemble(kept, chain)
        members = [kept[i] for i in chain]
        timing = Timing(
            started_at=members[0].received_at,
            finished_at=members[-1].done_at,
            engine_seconds=float(sum(engine_seconds(c) for c in members)),
            ttft_seconds=[
                (c.first_token_at - (c.engine_sent_at or c.received_at or c.first_token_at))
                if c.first_token_at is not None
                else 0.0
                for c in members
            ],
        )
        meta = TraceMetadata(
            trace_id=f"{session_id}:{k:04d}",
            job=session.job,
            session_id=str(session_id),
            task_id=session.task_id,
            group_id=session.group_id,
            sample_index=session.sample_index,
            harness=session.harness,
            model=session.model,
            tokenizer=session.tokenizer,
            builder=builder,
            reward=reward,
            evaluator_reward=session.reward,
            outcome="fail_closed" if reasons else "ok",
            fail_closed_reasons=list(reasons),
            outcome_kind=kind,
            finish_reasons=[c.finish_reason for c in members],
            branch_of=kept[branched].call_id if branched >= 0 else None,
            new_root_reason=root_reason[chain[0]] if branched < 0 else None,
            timings=timing,
            extra=dict(session.extra),
        )
        traces.append(Trace(tokens=tokens, loss_mask=mask, logprobs=logprobs, spans=spans, meta=meta))

    stats.traces = len(traces)
    stats.tokens = sum(t.num_tokens for t in traces)
    stats.trainable_tokens = sum(t.num_trainable for t in traces)
    for t in traces:
        t.meta.stats = stats
    return BuildResult(traces=traces, stats=stats, outcome="fail_closed" if reasons else "ok", fail_closed_reasons=reasons)


def build_traces(
    source: CaptureLog | Sequence[CaptureRecord] | str | os.PathLike[str],
    *,
    builder: str = "prefix-merge",
    session: SessionInfo | None = None,
) -> BuildResult:
    """Build a session's traces from its capture log (a path, a `CaptureLog`, or records)."""
    if isinstance(source, str | os.PathLike):
        log = read_capture_log(source)
        if session is None or session.session_id is None:
            session = (session or SessionInfo()).model_copy(update={"session_id": Path(source).stem})
    elif isinstance(source, CaptureLog):
        log = source
    else:
        log = CaptureLog(records=list(source))
    if (session is None or session.session_id is None) and log.records:
        session = (session or SessionInfo()).model_copy(update={"session_id": log.records[0].session_id})
    calls = calls_from_records(log.records)
    return build_from_calls(calls, builder=builder, session=session, torn_tail=log.torn_tail, bad_lines=len(log.bad_lines))
