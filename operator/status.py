"""Phase, conditions and counters of a RolloutJob, computed from observed children (pure).

The names a platform team sees - phases, condition types, reasons - are the constants below, and
`calculate_status` is the one place that turns what a reconcile observed (`Progress`) into the job's
`RolloutJobStatus` (after KubeRay's calculateStatus); `status_patch` is its wire form. Status is
bounded: counters and the last few batches only, never per-session lists. Conditions are keyed by
type; `lastTransitionTime` only moves when a condition's status flips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tracefleet.contract.job import (  # noqa: F401 - FINISHED_PHASES: listed here with the phases below
    FINISHED_PHASES,
    RECENT_BATCHES_MAX,
    BatchRef,
    Condition,
    Counters,
    RolloutJobStatus,
)
from tracefleet.contract.semantics import QUARANTINE_RATE_EXCEEDED, DiagnosticsCounts, quarantine_verdict
from tracefleet.contract.sealed_batch import SealedBatch
# Reasons of QuarantineRateExceeded, defined with it in semantics (the True one is also its Warning Event's).
from tracefleet.contract.semantics import (  # noqa: F401 - listed here with the other names a platform team sees
    REASON_QUARANTINE_RATE_ABOVE,
    REASON_QUARANTINE_RATE_WITHIN,
    REASON_TOO_FEW_JUDGED,
)

# Phases (tracefleet.contract.job.Phase; FINISHED_PHASES is defined there, for readers of a status below the operator).
PENDING = "Pending"
RUNNING = "Running"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PHASES = (PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED)
STARTED_PHASES = (RUNNING, SUCCEEDED, FAILED)

# Condition types.
COND_INFERENCE_READY = "InferenceReady"
COND_SPEC_ACCEPTED = "SpecAccepted"  # only present (False) while an immutable field change is refused
COND_RUNNING = "Running"
COND_COMPLETE = "Complete"
COND_FAILED = "Failed"
COND_SUSPENDED = "Suspended"
# True while the share of sealed sessions the diagnostics quarantined is above spec.diagnosticsPolicy
# (tracefleet.contract.semantics: the same condition `tracefleet run` reports); present once a batch is sealed.
COND_QUARANTINE_RATE = QUARANTINE_RATE_EXCEEDED

# Reasons of the job's conditions.
REASON_INVALID_SPEC = "InvalidSpec"
REASON_CHILD_REJECTED = "ChildRejected"  # the API server refused a child built from the spec
REASON_IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
REASON_SEAL_FAILED = "SealFailed"
REASON_FINISHED = "Finished"
REASON_ALL_SESSIONS_FINISHED = "AllSessionsFinished"
REASON_ALL_SESSIONS_FAILED = "AllSessionsFailed"
REASON_SOME_SESSIONS_SUCCEEDED = "SomeSessionsSucceeded"
REASON_SUSPENDED = "Suspended"
REASON_SPEC_SUSPEND = "SpecSuspend"
REASON_NOT_SUSPENDED = "NotSuspended"
REASON_NOT_FAILED = "NotFailed"
REASON_IN_PROGRESS = "InProgress"
REASON_SESSIONS_RUNNING = "SessionsRunning"
REASON_WAITING_FOR_INFERENCE = "WaitingForInference"
REASON_STARTING = "Starting"
# Reasons of InferenceReady.
REASON_CREATING = "Creating"
REASON_DEPLOYMENT_AVAILABLE = "DeploymentAvailable"
REASON_DEPLOYMENT_UNAVAILABLE = "DeploymentUnavailable"
REASON_ENDPOINT_REACHABLE = "EndpointReachable"
REASON_ENDPOINT_UNREACHABLE = "EndpointUnreachable"

# Condition status values.
TRUE = "True"
FALSE = "False"
UNKNOWN = "Unknown"
# A condition's message is cut to this many characters (status stays small).
MESSAGE_MAX = 1024

# Event reasons beside the conditions'.
EVENT_BATCH_SEALED = "BatchSealed"
EVENT_TASK_LEFT_OUT = "HarborTaskLeftOut"  # a Harbor task folder with a problem: the job runs the others
EVENT_DASHBOARD_URL = "DashboardUrl"  # the job's page on the chart's dashboard, when status.dashboardUrl is set
NORMAL = "Normal"
WARNING = "Warning"


def cond(type_: str, holds: bool | None, reason: str, message: str = "") -> Condition:
    """A condition as computed (its transition time and generation are set when status is calculated);
    `holds` None is Unknown."""
    return Condition(type=type_, status=UNKNOWN if holds is None else (TRUE if holds else FALSE), reason=reason,
                     message=message[:MESSAGE_MAX])


@dataclass
class Progress:
    """What one reconcile observed, all that phase and conditions depend on."""

    generation: int
    counts: Counters
    inference: Condition  # InferenceReady, as the inference step found it
    batches: list[SealedBatch] = field(default_factory=list)  # recorded batches, ascending seq
    spec_rejected: str = ""  # why a spec change is refused; "" when the spec is accepted
    seal_failed: str = ""  # which sealer Job failed; "" when none did
    unsealed: bool = False  # finished sessions or sealer Jobs whose batch is not recorded yet
    suspended: bool = False
    terminating: int = 0  # harness pods deleted by suspend, still going away
    quarantine: Condition | None = None  # QuarantineRateExceeded (quarantine_condition); None before a batch is sealed


def quarantine_condition(diagnostics: DiagnosticsCounts, max_rate: float, min_judged: int) -> Condition | None:
    """QuarantineRateExceeded from the sealed batches' counts (tracefleet.contract.semantics.quarantine_verdict,
    as `tracefleet run` decides it); None while nothing is judged."""
    if diagnostics.judged == 0:
        return None
    v = quarantine_verdict(diagnostics, max_rate, min_judged)
    return cond(COND_QUARANTINE_RATE, v.exceeded, v.reason, v.message)


def _phase_and_conditions(p: Progress) -> tuple[str, list[Condition], bool]:
    """(phase, conditions, finished): the job is finished when every session finished and every batch
    is recorded, failed when a sealer failed or no session succeeded."""
    counts, total = p.counts, p.counts.total
    finished = counts.finished == total and not p.unsealed and not p.seal_failed
    conds = [p.inference]
    if p.spec_rejected:
        conds.append(cond(COND_SPEC_ACCEPTED, False, REASON_IMMUTABLE_FIELD_CHANGED, p.spec_rejected))
    if p.seal_failed:
        phase = FAILED
        conds += [cond(COND_RUNNING, False, REASON_SEAL_FAILED, p.seal_failed), cond(COND_COMPLETE, False, REASON_SEAL_FAILED),
                  cond(COND_FAILED, True, REASON_SEAL_FAILED, p.seal_failed), cond(COND_SUSPENDED, False, REASON_NOT_SUSPENDED)]
        finished = True
    elif finished:
        ok = counts.succeeded > 0 or total == 0
        phase = SUCCEEDED if ok else FAILED
        msg = f"{counts.succeeded}/{total} sessions succeeded, {counts.failed} failed, {len(p.batches)} batches sealed"
        conds += [
            cond(COND_RUNNING, False, REASON_FINISHED, msg),
            cond(COND_COMPLETE, ok, REASON_ALL_SESSIONS_FINISHED if ok else REASON_ALL_SESSIONS_FAILED, msg),
            cond(COND_FAILED, not ok, REASON_ALL_SESSIONS_FAILED if not ok else REASON_SOME_SESSIONS_SUCCEEDED, msg),
            cond(COND_SUSPENDED, False, REASON_NOT_SUSPENDED),
        ]
    elif p.suspended:
        phase = SUSPENDED
        conds += [
            cond(COND_RUNNING, False, REASON_SUSPENDED, "spec.suspend is true"),
            cond(COND_COMPLETE, False, REASON_SUSPENDED),
            cond(COND_FAILED, False, REASON_NOT_FAILED),
            cond(COND_SUSPENDED, True, REASON_SPEC_SUSPEND, "running sessions were stopped; they rerun on resume"),
        ]
    else:
        active = counts.running > 0 or counts.finished > 0 or p.terminating > 0
        phase = RUNNING if active else PENDING
        why = REASON_SESSIONS_RUNNING if active else (REASON_WAITING_FOR_INFERENCE if p.inference.status != TRUE else REASON_STARTING)
        conds += [
            cond(COND_RUNNING, active, why, f"{counts.running} running, {counts.finished}/{total} finished"),
            cond(COND_COMPLETE, False, REASON_IN_PROGRESS),
            cond(COND_FAILED, False, REASON_NOT_FAILED),
            cond(COND_SUSPENDED, False, REASON_NOT_SUSPENDED),
        ]
    if p.quarantine is not None:  # the job goes on either way (tracefleet.contract.semantics)
        conds.append(p.quarantine)
    return phase, conds, finished


def calculate_status(p: Progress, old: RolloutJobStatus | None = None, now: datetime | None = None,
                     recent: int = RECENT_BATCHES_MAX) -> RolloutJobStatus:
    """The job's status from what one reconcile observed and the status it had (`old`: transition and
    start times are kept); the last `recent` batches are listed."""
    phase, conds, finished = _phase_and_conditions(p)
    return _status(old or RolloutJobStatus(), phase, conds, p.counts, p.batches, p.generation, phase in STARTED_PHASES,
                   finished, recent, now)


def failed_status(old: RolloutJobStatus, generation: int, reason: str, message: str, recent: int,
                  now: datetime | None = None) -> RolloutJobStatus | None:
    """The status of a job that cannot run (an invalid spec, a child the API server refuses): Failed
    with `reason`, counters kept; None when `old` already says so."""
    conds = [cond(COND_FAILED, True, reason, message), cond(COND_RUNNING, False, reason), cond(COND_COMPLETE, False, reason)]
    new = _status(old, FAILED, conds, old.counters, [], generation, False, True, recent, now)
    return new if status_changed(old, new) else None


def _status(old: RolloutJobStatus, phase: str, conds: list[Condition], counts: Counters, batches: list[SealedBatch],
            generation: int, started: bool, finished: bool, recent: int, now: datetime | None) -> RolloutJobStatus:
    ts = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).replace(microsecond=0)
    prev = {c.type: c for c in old.conditions or ()}
    conditions = []
    for c in conds:
        before = prev.get(c.type)
        kept = before.last_transition_time if before is not None and before.status == c.status else None
        conditions.append(c.model_copy(update={"last_transition_time": kept or ts, "observed_generation": generation}))
    recent = min(recent, RECENT_BATCHES_MAX)
    return RolloutJobStatus(
        phase=phase,  # type: ignore[arg-type]  # one of PHASES
        conditions=conditions,
        counters=counts,
        recent_batches=[BatchRef(seq=b.seq, uri=b.uri, traces=b.traces, mean_reward=b.mean_reward, sealed_at=b.sealed_at)  # type: ignore[arg-type]
                        for b in batches[-recent:]] or None,
        batches_completed=len(batches),
        observed_generation=generation,
        start_time=old.start_time or (ts if started else None),
        completion_time=(old.completion_time or ts) if finished else None,
    )


def condition_events(old: list[Condition] | None, new: list[Condition]) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events for conditions that became True - Warning for Failed and
    QuarantineRateExceeded - and for a spec change that became refused."""
    by_type = {c.type: c for c in old or ()}
    events = []
    for c in new:
        prev = by_type.get(c.type)
        reason, message = c.reason or "", c.message or ""
        if c.status == TRUE and (prev is None or prev.status != TRUE):
            kind = WARNING if c.type in (COND_FAILED, COND_SPEC_ACCEPTED, COND_QUARANTINE_RATE) else NORMAL
            events.append((kind, reason, f"{c.type}: {message}".strip(": ")))
        if c.type == COND_SPEC_ACCEPTED and c.status == FALSE and (prev is None or prev.status != FALSE):
            events.append((WARNING, reason, message))
    return events


def status_patch(status: RolloutJobStatus) -> dict[str, Any]:
    """The wire form written to the status subresource (camelCase, no nulls)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def status_changed(old: RolloutJobStatus, new: RolloutJobStatus) -> bool:
    """Whether writing `new` changes anything (a no-op write is skipped); a field `new` leaves out that
    `old` has counts as a change."""
    before, after = status_patch(old), status_patch(new)
    return any(before.get(k) != after.get(k) for k in set(after) | {"recentBatches", "completionTime", "startTime"})
