"""A rerun's new verdicts on sessions already sealed: what `<job>/rejudged/<stamp>.json` holds (layout.rejudged_key).

Written by the driver that judged again (`tracefleet run` on the same job and output: tracefleet.runner.rejudge),
read by `BatchReader`, which gives each re-judged session's rows their new verdict when it reads their batch
(tracefleet.traces.rejudge). Sealed batches are never rewritten and no row is sealed twice: the verdict travels
beside them, as a diagnostic's overlay does.

Which sealed sessions a rerun judges again (`rejudges`): those the judge could not judge, and only those —
- the evaluator reported `unavailable` (it could not run or report: the row is the infrastructure's),
- no verdict was kept for a session whose harness finished (`evaluator_missing` alone: its judging was lost), or
- the judging timed out and the job's evaluator differs now from the one that timed out (`timeoutSeconds` raised,
  another command): a timeout under the same evaluator is the policy's outcome (the agent's code runs under the
  judge) and stays.
The harness is not run again: the session's patch, kept in its evidence, is judged on a fresh copy of the task's
workspace, as the evaluator Job judges an uploaded one.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from tracefleet.contract.semantics import EVALUATOR_REASON, REWARD_MISSING, SESSION_FAILURE_PREFIX
from tracefleet.contract.session import EvalOutcome

REJUDGING_VERSION = 1
# why a sealed session is judged again
UNAVAILABLE = "unavailable"  # its evaluator could not run or report
NEVER_JUDGED = "never judged"  # its harness finished, and no verdict was kept (its judging was lost)
EVALUATOR_CHANGED = "timed out; the evaluator changed"  # its judging timed out under an evaluator the job no longer has


def judging_reason(reason: str) -> bool:
    """Whether a fail-closed reason is the judging's (`evaluator_<status>`, `reward_missing`): what a new verdict
    replaces on the session's rows, beside the reasons the session keeps (its capture, its tool calls)."""
    return reason.startswith(EVALUATOR_REASON.format("")) or reason == REWARD_MISSING


def rejudges(fail_closed_reasons: list[str], evaluation: dict[str, Any] | None, evaluator_now: str) -> str | None:
    """Why a sealed session is judged again on a rerun (UNAVAILABLE, NEVER_JUDGED, EVALUATOR_CHANGED), None when not:
    `fail_closed_reasons` its rows', `evaluation` its verdict as sealed (the row metadata's `extra.evaluation`),
    `evaluator_now` the fingerprint of the job's evaluator (tracefleet.contract.session.evaluator_fingerprint)."""
    if EVALUATOR_REASON.format("unavailable") in fail_closed_reasons:
        return UNAVAILABLE
    if EVALUATOR_REASON.format("missing") in fail_closed_reasons and not any(
            r.startswith(SESSION_FAILURE_PREFIX) for r in fail_closed_reasons):
        return NEVER_JUDGED  # a session that failed before its judging (its harness timed out) was never to be judged
    if EVALUATOR_REASON.format("timeout") in fail_closed_reasons:
        before = ((evaluation or {}).get("details") or {}).get("evaluator_spec")
        # a verdict sealed before it recorded its evaluator cannot say the evaluator changed: it stays
        if before is not None and before != evaluator_now:
            return EVALUATOR_CHANGED
    return None


class RejudgedSession(BaseModel):
    """One session's new verdict, and what follows from it for its rows."""

    why: str  # UNAVAILABLE, NEVER_JUDGED or EVALUATOR_CHANGED
    evaluation: EvalOutcome  # the new judging
    reward: float | None  # the evaluator's reward (the rows' evaluator_reward)
    reasons: list[str] = Field(default_factory=list)  # the judging's fail-closed reasons now (none: it judged)
    # the session's result as judged now (tracefleet.contract.session.SessionResult's status, stage, error)
    status: str = "completed"
    stage: str | None = None
    error: str | None = None
    # the job's diagnostics over the session's evidence with the new verdict: they replace the sealed findings
    findings: list[dict[str, Any]] = Field(default_factory=list)
    quarantined: bool = False


class Rejudging(BaseModel):
    """One rerun's re-judgings (`<job>/rejudged/<stamp>.json`), and the sessions it ran again (`superseded`)."""

    rejudging_version: int = REJUDGING_VERSION
    job: str
    created_at: float = Field(default_factory=time.time)
    sessions: dict[str, RejudgedSession] = Field(default_factory=dict)  # by session id
    # each batch holding a session judged again: its manifest's counts (sessions by outcome kind, reward statistics,
    # quarantines, findings: tracefleet.traces.batch.summarize's fields) with every verdict so far on its rows, which
    # readers of manifests (`traces ls`, the dashboard, Batch.manifest) show over the sealed ones
    batches: dict[int, dict[str, Any]] = Field(default_factory=dict)
    # sessions a rerun ran again (they failed before their first model call: tracefleet.contract.semantics.runs_again)
    # -> the batch holding their rows now: their rows sealed in an earlier batch (one without a token, the
    # infrastructure's) are no longer read, so each session is read once
    superseded: dict[str, int] = Field(default_factory=dict)
