"""spec.ttlSecondsAfterFinished: a finished job (and its children, by owner references) is deleted this
long after its completionTime (after JobSet's ttl_after_finished policy)."""

from __future__ import annotations

from datetime import datetime

from tracefleet.contract.job import RolloutJob, RolloutJobStatus


def ttl_expired(job: RolloutJob, status: RolloutJobStatus, now: datetime) -> bool:
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is None or status.completion_time is None:
        return False
    return (now - status.completion_time).total_seconds() >= ttl
