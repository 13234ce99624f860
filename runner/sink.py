"""Where local mode's traces go: collected per GRPO group, sealed into batches of whole groups
(`tracefleet.contract.semantics`: a batch is `groups_per_batch` groups; `tracefleet.traces.seal`).

A group is sealed only once every session of it has finished, and never straddles two batches, so
"this (task, sample) is in a sealed batch" is a yes/no question a rerun can ask (`sealed_keys`), and a
group cut short by Ctrl-C is run again whole. When the bucket is down, sealing keeps the batch in the
local spool and the run goes on; the final flush retries, and the summary says what is pending.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tracefleet.contract.semantics import (
    DiagnosticsCounts, OutcomeCounts, diagnostics_counts, next_batches, outcome_counts, runs_again,
)
from tracefleet.contract import layout
from tracefleet.bucket import BucketError, open_bucket, spool_dir
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.seal import SealError, Sealer


class BatchSink:
    def __init__(self, uri: str, job: str, *, groups_per_batch: int, spool: str | os.PathLike[str] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.job = job
        self.job_uri = f"{self.uri}/{job}"
        self.bucket = open_bucket(uri)
        # One spool per output: a batch staged for one bucket must never be flushed into another.
        spool = Path(spool) if spool is not None else spool_dir() / hashlib.sha256(self.uri.encode()).hexdigest()[:16]
        self.sealer = Sealer(self.bucket, job, spool=spool)
        self.groups_per_batch = groups_per_batch
        self._waiting: dict[str, int] = {}  # group -> sessions still to finish
        self._groups: dict[str, list[Any]] = {}  # group -> traces of its finished sessions
        self._ready: list[str] = []  # whole groups, in the order they finished
        self.sealed_traces = 0
        # what the diagnostics made of every sealed session of the job, earlier runs' batches included
        # (as the operator counts a job's recorded batches: tracefleet.contract.semantics)
        self.diagnostics = DiagnosticsCounts()
        self.outcomes = OutcomeCounts()  # the same sessions by outcome kind (status.counters.infrastructure)
        self.sealed_batches = 0  # the job's batches already in the output when this run began
        self.failed_before_model = 0  # sealed sessions that failed before a model call: this run runs them again
        self.errors: list[str] = []
        self.evidence_errors: list[str] = []

    def expect(self, group_sizes: dict[str, int]) -> None:
        """How many sessions of each group this run will finish before the group is sealed."""
        self._waiting.update(group_sizes)

    def sealed_keys(self) -> set[tuple[str, int]]:
        """(task_id, sample_index) of every session with traces in a sealed batch of this job, but those that
        failed before their first model call (tracefleet.contract.semantics.runs_again: a rerun runs them again,
        `self.failed_before_model` counts them). Batches staged by an earlier run that could not reach the
        bucket are uploaded first."""
        try:
            self.sealer.flush()
        except SealError as exc:
            self.errors.append(str(exc))
        keys: set[tuple[str, int]] = set()
        again: set[tuple[str, int]] = set()
        reader = BatchReader(self.bucket, self.job)
        for seq in reader.seqs():
            manifest = reader.manifest(seq)
            self.sealed_batches += 1
            self._count_sessions(manifest)
            table = reader.read_table(manifest).select(["task_id", "sample_index", "fail_closed_reasons", "metadata_json"])
            for task, sample, reasons, meta in zip(*(table.column(c).to_pylist() for c in table.column_names)):
                if task is None or sample is None:
                    continue
                key = (task, int(sample))
                calls = json.loads(meta).get("stats", {}).get("calls", 0) if meta else 0
                (again if runs_again(reasons or [], calls) else keys).add(key)
        self.failed_before_model = len(again - keys)
        return keys

    def _seal(self, traces: list[Any]) -> list[str]:
        try:
            manifest = self.sealer.seal(traces)
        except SealError as exc:
            self.errors.append(str(exc))
            return []
        self._count(manifest)
        return [f"{self.job_uri}/batches/{manifest.seq:06d}"]

    def _count(self, manifest: Any) -> None:
        self.sealed_traces += manifest.traces
        self._count_sessions(manifest)

    def _count_sessions(self, manifest: Any) -> None:
        self.diagnostics += diagnostics_counts(manifest)
        self.outcomes += outcome_counts(manifest)

    def add(self, group_id: str, session_traces: list[Any]) -> list[str]:
        """One finished session's traces (none when the session is not to be sealed, e.g. not accepted).
        Seals when whole groups fill a batch. Returns new batch URIs."""
        self._groups.setdefault(group_id, []).extend(session_traces)
        self._waiting[group_id] = self._waiting.get(group_id, 1) - 1
        if self._waiting[group_id] > 0:
            return []
        self._ready.append(group_id)
        return self._seal_ready(final=False)

    def _seal_ready(self, final: bool) -> list[str]:
        refs: list[str] = []
        for groups in next_batches(self._ready, self.groups_per_batch, final=final):
            for g in groups:
                self._ready.remove(g)
            batch = [t for g in groups for t in self._groups.pop(g)]
            if batch:
                refs += self._seal(batch)
        return refs

    def flush(self) -> list[str]:
        """Seal the whole groups still waiting (a short last batch), then retry anything left in the spool.
        Groups with a session that never finished (interrupted) are not sealed: a rerun runs them again."""
        refs = self._seal_ready(final=True)
        try:
            for manifest in self.sealer.flush():
                self._count(manifest)
                refs.append(f"{self.job_uri}/batches/{manifest.seq:06d}")
        except SealError as exc:
            self.errors.append(str(exc))
        return refs

    def keep_evidence(self, evidence: Any) -> None:
        """A finished session's evidence (tracefleet.diagnostics), kept in the bucket beside the batches
        for `tracefleet diagnose`. Best effort: the session's folder in the work dir keeps it too."""
        try:
            self.bucket.put(layout.evidence_key(self.job, evidence.session_id), evidence.model_dump_json().encode())
        except BucketError as exc:
            self.evidence_errors.append(str(exc))

    @property
    def pending_spool(self) -> Path:
        return self.sealer.spool
