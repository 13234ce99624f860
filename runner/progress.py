"""The run's progress beside its batches (`<job>/progress.json`, tracefleet.contract.progress.JobProgress), for the
dashboard: written from a thread of its own, the newest only, so a slow or unreachable bucket never holds up the
sessions; a write that fails is said once, and the run goes on."""

from __future__ import annotations

import threading
from typing import Any, Callable

from tracefleet.contract import layout
from tracefleet.contract.progress import JobProgress

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
