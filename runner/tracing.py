"""A finished session's rows for sealing, in both drivers: its capture log built into traces with the
session's reward and outcome attached, so the fail-closed rules apply (`tracefleet.contract.semantics`).

`session_traces` is what the local runner and the sealer Job call, over `outcome_of` the session's judged
`SessionResult` (in the sealer: the harness pod's result.json judged with the evaluator Job's reward.json),
so both drivers attach the same outcome and trace metadata `extra`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tracefleet.contract.semantics import (AUXILIARY, DROPPED_BY_DIAGNOSTICS, NO_TRAINABLE_CALLS, outcome_kind,
                                           session_failure_reason)
from tracefleet.contract.diagnostics import quarantined_reward

if TYPE_CHECKING:
    from tracefleet.contract.diagnostics import SessionFindings
    from tracefleet.diagnostics.evidence import SessionEvidence
    from tracefleet.contract.session import SessionPlan, SessionResult
    from tracefleet.traces.schema import BuildResult

__all__ = ["NO_TRAINABLE_CALLS", "SessionOutcome", "build_session_traces", "outcome_of", "session_traces"]


@dataclass
class SessionOutcome:
    """What the driver knows about one finished session besides its capture log."""

    job: str
    session_id: str
    task_id: str
    group_id: str
    sample_index: int
    status: str = "completed"  # completed | error | timeout (runner.session.SessionStatus)
    stage: str | None = None
    reward: float | None = None  # the evaluator's; None when the session was never judged
    evaluator_status: str = "missing"  # ok | error | timeout | unavailable | missing
    capture_complete: bool = True
    harness: str | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def evaluator_status(result: SessionResult) -> str:
    """What the trace builder's fail-closed rules need to know about the judging."""
    if result.evaluation is None:
        return "missing"  # the session never reached the evaluator (timeout, crash): no positive reward
    status = result.evaluation.status
    return status if status in ("ok", "timeout", "unavailable") else "error"


def outcome_of(result: SessionResult) -> SessionOutcome:
    """A session's outcome from its judged result: what both drivers attach to its rows (the sealer reads
    the result from result.json and judges it with reward.json, tracefleet.runner.pod.sealer_job)."""
    return SessionOutcome(
        job=result.job,
        session_id=result.session_id,
        task_id=result.task_id,
        group_id=result.group_id,
        sample_index=result.sample_index,
        status=result.status,
        stage=result.stage,
        reward=result.reward if result.evaluation is not None else None,
        evaluator_status=evaluator_status(result),
        capture_complete=result.stage != "capture",
        harness=result.harness,
        model=result.model,
        extra={
            "session_status": result.status,
            "session_stage": result.stage,
            "session_error": result.error,
            "harness_exit_code": result.harness_exit_code,
            "evaluation": result.evaluation.model_dump(mode="json") if result.evaluation else None,
            "timings": dict(result.timings),
            "task_metadata": dict(result.task_metadata),
        },
    )


def session_traces(capture: str | os.PathLike[str] | None, outcome: SessionOutcome, builder: str = "prefix-merge",
                   findings: SessionFindings | None = None) -> BuildResult:
    """The session's traces; a session without a trainable call of the agent's conversation also gets one
    row without tokens, so its GRPO group stays whole (it counts in the group's statistics and trains
    nothing). `findings` (tracefleet.diagnostics) go on every row; a quarantined session's rewards are
    forced to <= 0 and its rows marked `quarantined` (the reader leaves them out by default); a dropped
    session keeps only the row without tokens."""
    built = _session_rows(capture, outcome, builder, dropped=findings is not None and findings.action == "drop")
    if findings is not None:
        labelled = [f.model_dump(mode="json") for f in findings.findings]
        for t in built.traces:
            t.meta.diagnostics = labelled
            t.meta.quarantined = findings.quarantined
            if findings.quarantined:
                t.meta.reward = quarantined_reward(t.meta.reward)
    return built


def _session_rows(capture: str | os.PathLike[str] | None, outcome: SessionOutcome, builder: str, *, dropped: bool) -> BuildResult:
    from tracefleet.traces.build import build_traces, fail_closed_reasons
    from tracefleet.traces.schema import BuildResult, ReconstructionStats, SessionInfo, Trace, TraceMetadata

    info = SessionInfo(
        job=outcome.job,
        session_id=outcome.session_id,
        task_id=outcome.task_id,
        group_id=outcome.group_id,
        sample_index=outcome.sample_index,
        harness=outcome.harness,
        model=outcome.model,
        reward=outcome.reward,
        evaluator_status=outcome.evaluator_status,  # type: ignore[arg-type]
        capture_complete=outcome.capture_complete,
        failure=session_failure_reason(outcome.status, outcome.stage),
        extra=dict(outcome.extra),
    )
    if capture is not None and os.path.exists(capture):
        built = build_traces(capture, builder=builder, session=info)
    else:
        built = BuildResult(traces=[], stats=ReconstructionStats(builder=builder))
    if dropped:
        built = BuildResult(traces=[], stats=built.stats)  # a diagnostic dropped it: no token row is sealed
    elif any(t.meta.new_root_reason != AUXILIARY for t in built.traces):
        return built
    # Nothing of the agent's conversation to train on (auxiliary traces are not trained on by default).
    reasons = fail_closed_reasons([], info, built.stats.torn_tail, built.stats.bad_lines) + [DROPPED_BY_DIAGNOSTICS if dropped else NO_TRAINABLE_CALLS]
    meta = TraceMetadata(
        trace_id=f"{outcome.session_id}:{len(built.traces):04d}", job=outcome.job, session_id=outcome.session_id, task_id=outcome.task_id,
        group_id=outcome.group_id, sample_index=outcome.sample_index, harness=outcome.harness, model=outcome.model,
        builder=builder, reward=min(outcome.reward, 0.0) if outcome.reward is not None else 0.0,
        evaluator_reward=outcome.reward, outcome="fail_closed", fail_closed_reasons=reasons,
        outcome_kind=outcome_kind(reasons, model_answered=built.stats.answered_calls > 0), stats=built.stats,
        extra=dict(outcome.extra),
    )
    # after any auxiliary traces: a trainer that leaves those out still sees the session
    empty = Trace(tokens=np.zeros(0, np.int32), loss_mask=np.zeros(0, np.uint8), logprobs=np.zeros(0, np.float32),
                  spans=[], meta=meta)
    return BuildResult(traces=[*built.traces, empty], stats=built.stats, outcome="fail_closed", fail_closed_reasons=reasons)


def build_session_traces(plan: SessionPlan, result: SessionResult, evidence: SessionEvidence | None = None) -> list[Any]:
    """The local runner's session → traces, judged by the job's diagnostics; records the build's counts
    on the result."""
    from tracefleet.diagnostics.registry import configured, run_diagnostics, unavailable

    resolved = configured(plan.diagnostics)
    findings = run_diagnostics(evidence, resolved=resolved) if evidence is not None else unavailable(
        f"no evidence: {result.error}", resolved)
    built = session_traces(result.capture_path, outcome_of(result), plan.builder, findings)
    result.traces = len(built.traces)
    result.tokens = sum(t.num_tokens for t in built.traces)
    result.trainable_tokens = sum(t.num_trainable for t in built.traces)
    result.capture_torn = built.stats.torn_tail
    result.build_stats = built.stats.model_dump(mode="json")
    result.outcome_kind = next((t.meta.outcome_kind for t in reversed(built.traces)), None)  # the session's own row last
    return list(built.traces)
