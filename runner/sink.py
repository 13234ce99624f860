"""Where local mode's traces go: buffered per session, sealed into batches (`tracefleet.traces.seal`).

A session's traces never straddle two batches, so "this (task, sample) is in a sealed batch" is a
yes/no question a rerun can ask (`sealed_keys`). When the bucket is down, sealing keeps the batch in
the local spool and the run goes on; the final flush retries, and the summary says what is pending.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tracefleet.bucket import open_bucket, spool_dir
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import SealError, Sealer


class BatchSink:
    def __init__(self, uri: str, job: str, *, traces_per_batch: int, spool: str | os.PathLike[str] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.job = job
        self.job_uri = f"{self.uri}/{job}"
        self.bucket = open_bucket(uri)
        # One spool per output: a batch staged for one bucket must never be flushed into another.
        spool = Path(spool) if spool is not None else spool_dir() / hashlib.sha256(self.uri.encode()).hexdigest()[:16]
        self.sealer = Sealer(self.bucket, job, spool=spool)
        self.traces_per_batch = traces_per_batch
        self._buffer: list[Any] = []
        self.sealed_traces = 0
        self.errors: list[str] = []

    def sealed_keys(self) -> set[tuple[str, int]]:
        """(task_id, sample_index) of every session with traces in a sealed batch of this job. Batches
        staged by an earlier run that could not reach the bucket are uploaded first."""
        try:
            self.sealer.flush()
        except SealError as exc:
            self.errors.append(str(exc))
        keys: set[tuple[str, int]] = set()
        reader = BatchReader(self.bucket, self.job)
        for seq in reader.seqs():
            table = reader.read_table(seq).select(["task_id", "sample_index"])
            for task, sample in zip(table.column("task_id").to_pylist(), table.column("sample_index").to_pylist()):
                if task is not None and sample is not None:
                    keys.add((task, int(sample)))
        return keys

    def _seal(self, traces: list[Any]) -> list[str]:
        try:
            manifest = self.sealer.seal(traces)
        except SealError as exc:
            self.errors.append(str(exc))
            return []
        self.sealed_traces += manifest.traces
        return [f"{self.job_uri}/batches/{manifest.seq:06d}"]

    def add(self, session_traces: list[Any]) -> list[str]:
        """Buffer one session's traces; seal when the buffer holds a batch. Returns new batch URIs."""
        if not session_traces:
            return []
        self._buffer.extend(session_traces)
        if len(self._buffer) < self.traces_per_batch:
            return []
        batch, self._buffer = self._buffer, []
        return self._seal(batch)

    def flush(self) -> list[str]:
        """Seal what is buffered (a short last batch), then retry anything left in the spool."""
        refs: list[str] = []
        if self._buffer:
            batch, self._buffer = self._buffer, []
            refs += self._seal(batch)
        try:
            for manifest in self.sealer.flush():
                self.sealed_traces += manifest.traces
                refs.append(f"{self.job_uri}/batches/{manifest.seq:06d}")
        except SealError as exc:
            self.errors.append(str(exc))
        return refs

    @property
    def pending_spool(self) -> Path:
        return self.sealer.spool
