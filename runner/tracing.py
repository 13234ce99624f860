"""Turn a finished session's capture log into traces (`tracefleet.traces` builders), with the
session's reward and outcome attached so the fail-closed rules can apply."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracefleet.runner.session import SessionPlan, SessionResult


def evaluator_status(result: SessionResult) -> str:
    """What the trace builder's fail-closed rules need to know about the judging."""
    if result.evaluation is None:
        return "missing"  # the session never reached the evaluator (timeout, crash): no positive reward
    status = result.evaluation.status
    return status if status in ("ok", "timeout") else "error"


def build_session_traces(plan: SessionPlan, result: SessionResult) -> list[Any]:
    from tracefleet.traces.build import build_traces
    from tracefleet.traces.schema import SessionInfo

    info = SessionInfo(
        job=plan.job,
        session_id=plan.session_id,
        task_id=plan.task.id,
        group_id=plan.group_id,
        sample_index=plan.sample_index,
        harness=plan.harness.preset,
        model=plan.model,
        reward=result.reward if result.evaluation is not None else None,
        evaluator_status=evaluator_status(result),  # type: ignore[arg-type]
        capture_complete=result.stage != "capture",
        extra={
            "session_status": result.status,
            "session_stage": result.stage,
            "session_error": result.error,
            "harness_exit_code": result.harness_exit_code,
            "evaluation": result.evaluation.model_dump(mode="json") if result.evaluation else None,
            "timings": dict(result.timings),
            "task_metadata": plan.task.metadata,
        },
    )
    built = build_traces(result.capture_path, builder=plan.builder, session=info)
    result.traces = len(built.traces)
    result.tokens = sum(t.num_tokens for t in built.traces)
    result.trainable_tokens = sum(t.num_trainable for t in built.traces)
    result.capture_torn = built.stats.torn_tail
    result.build_stats = built.stats.model_dump(mode="json")
    return list(built.traces)
