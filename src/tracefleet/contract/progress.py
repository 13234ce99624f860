"""A job's live progress, as whatever drives it writes it beside its batches (`<job>/progress.json`,
tracefleet.contract.layout.progress_key): the running count and the ETA that no sealed batch holds.

Its counters are the RolloutJob's own (`status.counters`, tracefleet.contract.job.Counters), so a reader sees the
same figures for a local run and a cluster job. The object is overwritten as the job goes on: a reader takes the
newest (`updated_at` says how old it is) and never needs an older one.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from tracefleet.contract.job import FINISHED_PHASES, Counters, RolloutJobStatus

LOCAL = "local"  # `tracefleet run` (and the jobs `tracefleet train` runs)
KUBERNETES = "kubernetes"


def eta_seconds(elapsed_s: float, finished: int, remaining: int) -> float | None:
    """Seconds until the remaining sessions finish at the pace so far (None: nothing finished yet, or done)."""
    if finished <= 0 or remaining <= 0:
        return None
    return elapsed_s / finished * remaining


class JobProgress(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    job: str
    driver: Literal["local", "kubernetes"]
    counters: Counters = Field(default_factory=Counters)
    skipped: int = Field(default=0, ge=0, description="Sessions sealed by an earlier run of the job (not in counters).")
    calls: int = Field(default=0, ge=0, description="Model calls made so far.")
    batches: int = Field(default=0, ge=0, description="Batches sealed so far by this run.")
    started_at: datetime
    updated_at: datetime
    finished: bool = False  # the driver is done with the job (every session ran, or it was stopped)
    eta_s: float | None = Field(default=None, ge=0, description="Seconds left at the pace so far, as of updated_at.")

    def eta_now_s(self, now: datetime | None = None) -> float | None:
        """The ETA counted down by the time since the driver wrote it (never below 0)."""
        if self.finished or self.eta_s is None:
            return None
        age = ((now or datetime.now(timezone.utc)) - self.updated_at).total_seconds()
        return max(0.0, self.eta_s - max(0.0, age))

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def of_status(cls, job: str, status: RolloutJobStatus, now: datetime | None = None) -> JobProgress:
        """A cluster job's progress: its RolloutJob's status, as of `now` (the ETA from status.startTime)."""
        now = now or datetime.now(timezone.utc)
        c, started = status.counters, status.start_time or now
        finished = status.phase in FINISHED_PHASES
        eta = None if finished else eta_seconds((now - started).total_seconds(), c.finished, c.total - c.finished)
        return cls(job=job, driver=KUBERNETES, counters=c, batches=status.batches_completed, started_at=started,
                   updated_at=now, finished=finished, eta_s=eta)
