"""Phase, conditions and counters of a RolloutJob, computed from observed children (pure).

Status is bounded (design §6 and the Argo lesson): counters and the last few batches only,
never per-session lists. Conditions are keyed by type; `lastTransitionTime` only moves when a
condition's status flips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

CONDITION_TYPES = ("InferenceReady", "Running", "Complete", "Failed", "Suspended")


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

    def as_status(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("total", "pending", "running", "succeeded", "failed", "traces", "tokens")}

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
