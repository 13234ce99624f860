"""Phase, conditions and counters of a RolloutJob, computed from observed children (pure).

The names a platform team sees - phases, condition types, reasons - are the constants below, and
`calculate_status` is the one place that turns what a reconcile observed (`Progress`) into phase and
conditions (after KubeRay's calculateStatus). Status is bounded: counters and the last few batches
only, never per-session lists. Conditions are keyed by type; `lastTransitionTime` only moves when a
condition's status flips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tracefleet.contract.semantics import QUARANTINE_RATE_EXCEEDED, DiagnosticsCounts, quarantine_verdict
# Reasons of QuarantineRateExceeded, defined with it in semantics (the True one is also its Warning Event's).
from tracefleet.contract.semantics import (  # noqa: F401 - listed here with the other names a platform team sees
    REASON_QUARANTINE_RATE_ABOVE,
    REASON_QUARANTINE_RATE_WITHIN,
    REASON_TOO_FEW_JUDGED,
)

# Phases (tracefleet.contract.job.Phase).
PENDING = "Pending"
RUNNING = "Running"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PHASES = (PENDING, RUNNING, SUSPENDED, SUCCEEDED, FAILED)
FINISHED_PHASES = (SUCCEEDED, FAILED)
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

# Event reasons beside the conditions'.
EVENT_BATCH_SEALED = "BatchSealed"
NORMAL = "Normal"
WARNING = "Warning"


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class SessionCounts:
    total: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    traces: int = 0
    tokens: int = 0
    judged: int = 0  # sessions in sealed batches (tracefleet.contract.semantics.DiagnosticsCounts)
    quarantined: int = 0
    dropped: int = 0

    def as_status(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("total", "pending", "running", "succeeded", "failed", "traces", "tokens",
                                              "judged", "quarantined", "dropped")}

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed


@dataclass
class Cond:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str = ""


@dataclass
class Observed:
    """What one reconcile concluded; `build_status` turns it into the status patch."""

    generation: int
    counts: SessionCounts
    conditions: list[Cond]
    phase: str
    batches: list[dict[str, Any]] = field(default_factory=list)  # recorded batches, ascending seq
    started: bool = False
    finished: bool = False


def merge_conditions(old: list[dict[str, Any]] | None, new: list[Cond], generation: int, now: str) -> list[dict[str, Any]]:
    by_type = {c.get("type"): c for c in old or []}
    out = []
    for c in new:
        status = "Unknown" if c.status is None else ("True" if c.status else "False")
        prev = by_type.get(c.type)
        ltt = prev.get("lastTransitionTime") if prev and prev.get("status") == status else now
        out.append(
            {
                "type": c.type,
                "status": status,
                "reason": c.reason,
                "message": c.message[:1024],
                "lastTransitionTime": ltt or now,
                "observedGeneration": generation,
            }
        )
    return out


@dataclass
class Progress:
    """What one reconcile observed, all that phase and conditions depend on."""

    generation: int
    counts: SessionCounts
    inference: Cond  # InferenceReady, as the inference step found it
    batches: list[dict[str, Any]] = field(default_factory=list)  # recorded batches, ascending seq
    spec_rejected: str = ""  # why a spec change is refused; "" when the spec is accepted
    seal_failed: str = ""  # which sealer Job failed; "" when none did
    unsealed: bool = False  # finished sessions or sealer Jobs whose batch is not recorded yet
    suspended: bool = False
    terminating: int = 0  # harness pods deleted by suspend, still going away
    quarantine: Cond | None = None  # QuarantineRateExceeded (quarantine_condition); None before a batch is sealed


def quarantine_condition(diagnostics: DiagnosticsCounts, max_rate: float, min_judged: int) -> Cond | None:
    """QuarantineRateExceeded from the sealed batches' counts (tracefleet.contract.semantics.quarantine_verdict,
    as `tracefleet run` decides it); None while nothing is judged."""
    if diagnostics.judged == 0:
        return None
    v = quarantine_verdict(diagnostics, max_rate, min_judged)
    return Cond(COND_QUARANTINE_RATE, v.exceeded, v.reason, v.message)


def calculate_status(p: Progress) -> Observed:
    """Phase and conditions from what was observed: the job is finished when every session finished
    and every batch is recorded, failed when a sealer failed or no session succeeded."""
    counts, total = p.counts, p.counts.total
    finished = counts.finished == total and not p.unsealed and not p.seal_failed
    conds = [p.inference]
    if p.spec_rejected:
        conds.append(Cond(COND_SPEC_ACCEPTED, False, REASON_IMMUTABLE_FIELD_CHANGED, p.spec_rejected))
    if p.seal_failed:
        phase = FAILED
        conds += [Cond(COND_RUNNING, False, REASON_SEAL_FAILED, p.seal_failed), Cond(COND_COMPLETE, False, REASON_SEAL_FAILED),
                  Cond(COND_FAILED, True, REASON_SEAL_FAILED, p.seal_failed), Cond(COND_SUSPENDED, False, REASON_NOT_SUSPENDED)]
        finished = True
    elif finished:
        ok = counts.succeeded > 0 or total == 0
        phase = SUCCEEDED if ok else FAILED
        msg = f"{counts.succeeded}/{total} sessions succeeded, {counts.failed} failed, {len(p.batches)} batches sealed"
        conds += [
            Cond(COND_RUNNING, False, REASON_FINISHED, msg),
            Cond(COND_COMPLETE, ok, REASON_ALL_SESSIONS_FINISHED if ok else REASON_ALL_SESSIONS_FAILED, msg),
            Cond(COND_FAILED, not ok, REASON_ALL_SESSIONS_FAILED if not ok else REASON_SOME_SESSIONS_SUCCEEDED, msg),
            Cond(COND_SUSPENDED, False, REASON_NOT_SUSPENDED),
        ]
    elif p.suspended:
        phase = SUSPENDED
        conds += [
            Cond(COND_RUNNING, False, REASON_SUSPENDED, "spec.suspend is true"),
            Cond(COND_COMPLETE, False, REASON_SUSPENDED),
            Cond(COND_FAILED, False, REASON_NOT_FAILED),
            Cond(COND_SUSPENDED, True, REASON_SPEC_SUSPEND, "running sessions were stopped; they rerun on resume"),
        ]
    else:
        active = counts.running > 0 or counts.finished > 0 or p.terminating > 0
        phase = RUNNING if active else PENDING
        why = REASON_SESSIONS_RUNNING if active else (REASON_WAITING_FOR_INFERENCE if not p.inference.status else REASON_STARTING)
        conds += [
            Cond(COND_RUNNING, active, why, f"{counts.running} running, {counts.finished}/{total} finished"),
            Cond(COND_COMPLETE, False, REASON_IN_PROGRESS),
            Cond(COND_FAILED, False, REASON_NOT_FAILED),
            Cond(COND_SUSPENDED, False, REASON_NOT_SUSPENDED),
        ]
    if p.quarantine is not None:  # the job goes on either way (tracefleet.contract.semantics)
        conds.append(p.quarantine)
    return Observed(generation=p.generation, counts=counts, conditions=conds, phase=phase, batches=p.batches,
                    started=phase in STARTED_PHASES, finished=finished)


def failed_status(old: dict[str, Any], generation: int, reason: str, message: str, recent: int,
                  now: datetime | None = None) -> dict[str, Any] | None:
    """The status of a job that cannot run (an invalid spec, a child the API server refuses): Failed
    with `reason`, counters kept; None when `old` already says so."""
    obs = Observed(
        generation=generation,
        counts=SessionCounts(**{k: v for k, v in (old.get("counters") or {}).items() if k in SessionCounts.__dataclass_fields__}),
        conditions=[Cond(COND_FAILED, True, reason, message), Cond(COND_RUNNING, False, reason), Cond(COND_COMPLETE, False, reason)],
        phase=FAILED,
        finished=True,
    )
    new = build_status(old, obs, recent, now)
    return new if status_changed(old, new) else None


def condition_events(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events for conditions that became True - Warning for Failed and
    QuarantineRateExceeded - and for a spec change that became refused."""
    by_type = {c.get("type"): c for c in old or []}
    events = []
    for c in new:
        prev = by_type.get(c["type"])
        if c["status"] == "True" and (prev is None or prev.get("status") != "True"):
            kind = WARNING if c["type"] in (COND_FAILED, COND_SPEC_ACCEPTED, COND_QUARANTINE_RATE) else NORMAL
            events.append((kind, c["reason"], f"{c['type']}: {c['message']}".strip(": ")))
        if c["type"] == COND_SPEC_ACCEPTED and c["status"] == "False" and (prev is None or prev.get("status") != "False"):
            events.append((WARNING, c["reason"], c["message"]))
    return events


def build_status(old: dict[str, Any], obs: Observed, recent: int, now: datetime | None = None) -> dict[str, Any]:
    """The full status object for this reconcile (compare with `old` to skip no-op writes)."""
    ts = now_iso(now)
    status: dict[str, Any] = {
        "phase": obs.phase,
        "conditions": merge_conditions(old.get("conditions"), obs.conditions, obs.generation, ts),
        "counters": obs.counts.as_status(),
        "batchesCompleted": len(obs.batches),
        "observedGeneration": obs.generation,
    }
    if obs.batches:
        status["recentBatches"] = [
            {k: b[k] for k in ("seq", "uri", "traces", "meanReward", "sealedAt") if b.get(k) is not None}
            for b in obs.batches[-recent:]
        ]
    start = old.get("startTime") or (ts if obs.started else None)
    if start:
        status["startTime"] = start
    if obs.finished:
        status["completionTime"] = old.get("completionTime") or ts
    return status


def status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    keys = set(new) | {"recentBatches", "completionTime", "startTime"}
    return any(old.get(k) != new.get(k) for k in keys)
