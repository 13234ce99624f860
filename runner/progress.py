"""The run's progress beside its batches (`<job>/progress.json`, tracefleet.contract.progress.JobProgress), for the
dashboard: written from a thread of its own, the newest only, so a slow or unreachable bucket never holds up the
sessions; a write that fails is said once, and the run goes on."""

from __future__ import annotations

import threading
from typing import Any, Callable

from tracefleet.contract import layout
from tracefleet.contract.progress import JobProgress, progress_state

LAST_WRITE_WAIT_S = 10.0  # how long the end of a run waits for its last progress to be written


class ProgressWriter:
    def __init__(self, bucket: Any, job: str, say: Callable[[str], None]) -> None:
        self.bucket, self.key, self.say = bucket, layout.progress_key(job), say
        self._newest: JobProgress | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="progress-writer", daemon=True)
        self._thread.start()

    def offer(self, progress: JobProgress) -> None:
        with self._lock:
            self._newest = progress
        self._wake.set()

    def close(self, last: JobProgress) -> None:
        """Write `last` (the run's final progress) and stop, waiting at most LAST_WRITE_WAIT_S for it."""
        self.offer(last)
        self._closing = True
        self._wake.set()
        self._thread.join(LAST_WRITE_WAIT_S)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                progress, self._newest = self._newest, None
            if progress is not None:
                try:
                    self.bucket.put(self.key, progress.to_json())
                except Exception as exc:  # noqa: BLE001 - the run goes on; said once
                    if not self._failed:
                        self._failed = True
                        self.say(f"progress not written to {self.key}: {exc}")
            if self._closing and self._newest is None:
                return


def previous_run(bucket: Any, job: str) -> str | None:
    """What the job's last progress record says of the run that wrote it, when that run did not end well or may still
    be going (a line to say before this run starts), else None."""
    try:
        last = JobProgress.model_validate_json(bucket.get(layout.progress_key(job)))
    except Exception:  # noqa: BLE001 - none written, or unreadable: nothing to say of it
        return None
    state = progress_state(last)
    when = f"{last.updated_at:%Y-%m-%d %H:%M:%S} UTC"
    if state.kind == "running" and last.driver_process is not None and last.driver_process.alive():
        return (f"job {job!r} is being run by process {last.driver_process.pid} on this machine (its progress "
                f"written {when}): two runs of one job seal the same sessions twice")
    if state.kind in ("stopped", "stale"):
        how = "its process is gone" if state.kind == "stopped" else "its progress went stale"
        return (f"the last run of job {job!r} did not finish ({how}; last written {when}, {last.counters.finished} of "
                f"{last.counters.total} sessions finished): continuing it")
    return None
