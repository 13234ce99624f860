"""A job's live progress, as whatever drives it writes it beside its batches (`<job>/progress.json`,
tracefleet.contract.layout.progress_key): the running count and the ETA that no sealed batch holds.

Its counters are the RolloutJob's own (`status.counters`, tracefleet.contract.job.Counters), so a reader sees the
same figures for a local run and a cluster job. The object is overwritten as the job goes on: a reader takes the
newest (`updated_at` says how old it is) and never needs an older one.

A driver that stops writing must not look alive: while it runs, it rewrites the record at least every
`heartbeat_s` (its heartbeat), and names its process (`DriverProcess`) so that a reader on the same machine can
tell a driver that is gone (killed, crashed) from one that is only late. `progress_state` is the one reading of
a record that every surface shows: running, done, interrupted (n never started), stale since ..., stopped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from tracefleet.contract.job import FINISHED_PHASES, Counters, RolloutJobStatus

LOCAL = "local"  # `tracefleet run` (and the jobs `tracefleet train` runs)
KUBERNETES = "kubernetes"


# A record not rewritten for this many heartbeats is stale: its driver stopped writing (or cannot reach the bucket).
STALE_AFTER_HEARTBEATS = 3
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_PID_NAMESPACE = "/proc/self/ns/pid"


class DriverProcess(BaseModel):
    """The process that writes a job's progress, as a reader on the same machine (same boot, same pid namespace:
    containers on one kernel share the boot id, not their pids) can look it up; its start time (clock ticks since
    boot, /proc/PID/stat) tells a reused pid from it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    boot_id: str
    pid_namespace: str
    pid: int
    start_ticks: int

    @classmethod
    def current(cls) -> DriverProcess | None:
        """This process (None where /proc does not say: not Linux)."""
        try:
            return cls(boot_id=_BOOT_ID.read_text().strip(), pid_namespace=os.readlink(_PID_NAMESPACE),
                       pid=os.getpid(), start_ticks=_start_ticks(os.getpid()))
        except (OSError, ValueError):
            return None

    def alive(self) -> bool | None:
        """Whether the process still runs: None where this reader cannot tell (another machine or container)."""
        here = DriverProcess.current()
        if here is None or (here.boot_id, here.pid_namespace) != (self.boot_id, self.pid_namespace):
            return None
        try:
            return _start_ticks(self.pid) == self.start_ticks
        except (OSError, ValueError):
            return False


def _start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    if fields[0] == "Z":  # a zombie: it ended, its parent has not reaped it
        raise ValueError(f"process {pid} ended")
    return int(fields[19])  # field 22 of stat(5), counted from field 3


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
    interrupted: bool = Field(default=False, description="The driver was stopped (Ctrl-C, SIGTERM) before every "
                              "session ran; counters.pending are the sessions it never started.")
    heartbeat_s: float | None = Field(default=None, gt=0, description="While not finished, the driver rewrites the "
                                      "record at least this often (None: no such promise).")
    driver_process: DriverProcess | None = None
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


@dataclass(frozen=True)
class ProgressState:
    """What a progress record says about its job now (`progress_state`)."""

    kind: Literal["running", "done", "interrupted", "stale", "stopped"]
    never_started: int = 0  # interrupted: sessions it never started
    since: datetime | None = None  # stale, stopped: when the driver last wrote

    def words(self) -> str:
        if self.kind == "interrupted":
            return f"interrupted ({self.never_started:,} never started)"
        if self.kind == "stale":
            return f"stale since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else "stale"
        return self.kind


def progress_state(p: JobProgress, now: datetime | None = None) -> ProgressState:
    """Running; done; interrupted (n never started); stopped (its driver's process is gone, seen from the same
    machine, without having written its end); stale (not rewritten for STALE_AFTER_HEARTBEATS heartbeats)."""
    if p.finished:
        if p.interrupted:
            return ProgressState("interrupted", never_started=p.counters.pending)
        return ProgressState("done")
    if p.driver_process is not None and p.driver_process.alive() is False:
        return ProgressState("stopped", since=p.updated_at)
    age = ((now or datetime.now(timezone.utc)) - p.updated_at).total_seconds()
    if p.heartbeat_s is not None and age > STALE_AFTER_HEARTBEATS * p.heartbeat_s:
        return ProgressState("stale", since=p.updated_at)
    return ProgressState("running")
