"""Where local mode's traces go: collected per GRPO group, sealed into batches of whole groups
(`tracefleet.contract.semantics`: a batch is `groups_per_batch` groups; `tracefleet.traces.seal`).

A group is sealed only once every session of it has finished, and never straddles two batches, so
"this (task, sample) is in a sealed batch" is a yes/no question a rerun can ask (`sealed_keys`), and a
group cut short by Ctrl-C is run again whole. When the bucket is down, sealing keeps the batch in the
local spool and the run goes on; the final flush retries, and the summary says what is pending.

The job's sessions are counted once each, from their rows as a reader sees them (re-judgings applied:
tracefleet.traces.rejudge): a session sealed again by a rerun (it failed before its first model call) counts as its
newest rows say, not twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracefleet.contract.rejudge import RejudgedSession, rejudges
from tracefleet.contract.semantics import DROPPED_BY_DIAGNOSTICS, DiagnosticsCounts, OutcomeCounts, next_batches, runs_again
from tracefleet.contract import layout
from tracefleet.bucket import BucketError, open_bucket, spool_dir
from tracefleet.traces.reader import BatchReader
from tracefleet.traces.rejudge import current_rejudgings, read_as_now
from tracefleet.traces.seal import SealError, Sealer


# the columns of a sealed row the sink reads (not its tokens)
ROW_COLUMNS = ("session_id", "task_id", "sample_index", "fail_closed_reasons", "metadata_json", "outcome_kind",
               "quarantined", "diagnostics")


@dataclass(frozen=True)
class SealedSession:
    """What a sealed session's rows say for the job's counts (each session once)."""

    kind: str | None  # its outcome kind (None in batches sealed before kinds)
    quarantined: bool
    dropped: bool
    diagnostics: frozenset[str]  # the diagnostics with a finding on it


@dataclass(frozen=True)
class RejudgeCandidate:
    """A sealed session a rerun judges again (tracefleet.contract.rejudge.rejudges)."""

    session_id: str
    task_id: str
    sample_index: int
    why: str
    seq: int  # the batch holding its rows


def sealed_sessions(rows: Iterable[dict[str, Any]]) -> dict[str, SealedSession]:
    """Each session of `rows` (a batch's, as a reader reads them) once, from its first row (a session's rows share
    its reasons, so its kind, its findings and its quarantine)."""
    out: dict[str, SealedSession] = {}
    for row in rows:
        if row["session_id"] in out:
            continue
        out[row["session_id"]] = SealedSession(
            kind=row.get("outcome_kind"), quarantined=bool(row.get("quarantined")),
            dropped=DROPPED_BY_DIAGNOSTICS in (row.get("fail_closed_reasons") or []),
            diagnostics=frozenset(d["name"] for d in row.get("diagnostics") or ()))
    return out


def session_counts(sessions: Iterable[SealedSession]) -> tuple[DiagnosticsCounts, OutcomeCounts]:
    """The diagnostics' and outcome kinds' counts of `sessions`, as a batch manifest counts its own
    (tracefleet.traces.batch.summarize), over the whole job."""
    judged = quarantined = dropped = 0
    quarantined_by: dict[str, int] = {}
    dropped_by: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for s in sessions:
        judged += 1
        quarantined += s.quarantined
        dropped += s.dropped
        for name in s.diagnostics:
            if s.quarantined:
                quarantined_by[name] = quarantined_by.get(name, 0) + 1
            if s.dropped:
                dropped_by[name] = dropped_by.get(name, 0) + 1
        if s.kind is not None:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
    return (DiagnosticsCounts(judged, quarantined, dropped, dict(sorted(quarantined_by.items())),
                              dict(sorted(dropped_by.items()))), OutcomeCounts.from_json(kinds))


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
        # every sealed session of the job, earlier runs' batches included, once each (the module doc)
        self._sessions: dict[str, SealedSession] = {}
        self.sealed_batches = 0  # the job's batches already in the output when this run began
        self.failed_before_model = 0  # sealed sessions that failed before a model call: this run runs them again
        self.to_rejudge: list[RejudgeCandidate] = []  # sealed sessions the judge could not judge: judged again
        self.runs_again_from: dict[str, int] = {}  # sealed sessions this run runs again -> the batch of their rows
        self.resealed: dict[str, int] = {}  # of those, sealed again by this run -> the batch of their new rows
        self.errors: list[str] = []
        self.evidence_errors: list[str] = []

    @property
    def diagnostics(self) -> DiagnosticsCounts:
        """What the diagnostics made of the job's sealed sessions (status.counters.{judged,quarantined,dropped} on
        a cluster, counted there from the manifests)."""
        return session_counts(self._sessions.values())[0]

    @property
    def outcomes(self) -> OutcomeCounts:
        """The job's sealed sessions by outcome kind (status.counters.infrastructure on a cluster)."""
        return session_counts(self._sessions.values())[1]

    def expect(self, group_sizes: dict[str, int]) -> None:
        """How many sessions of each group this run will finish before the group is sealed."""
        self._waiting.update(group_sizes)

    def sealed_keys(self, evaluators: dict[tuple[str, int], str] | None = None) -> set[tuple[str, int]]:
        """(task_id, sample_index) of every session with traces in a sealed batch of this job, but those that
        failed before their first model call (tracefleet.contract.semantics.runs_again: a rerun runs them again,
        `self.failed_before_model` counts them). `evaluators`: each session's evaluator now, by (task_id,
        sample_index), as its fingerprint (tracefleet.contract.session.evaluator_fingerprint); the sealed sessions
        to judge again are then in `self.to_rejudge` (tracefleet.contract.rejudge.rejudges). Batches staged by an
        earlier run that could not reach the bucket are uploaded first."""
        try:
            self.sealer.flush()
        except SealError as exc:
            self.errors.append(str(exc))
        keys: set[tuple[str, int]] = set()
        again: set[tuple[str, int]] = set()
        candidates: dict[str, RejudgeCandidate] = {}
        reader = BatchReader(self.bucket, self.job)
        rejudged = current_rejudgings(self.bucket, self.job)
        for seq in reader.seqs():
            self.sealed_batches += 1
            table = read_as_now(reader.read_table(seq), rejudged, seq)
            rows = table.select([c for c in ROW_COLUMNS if c in table.column_names]).to_pylist()
            self._sessions.update(sealed_sessions(rows))
            for row in rows:
                task, sample, reasons = row["task_id"], row["sample_index"], row["fail_closed_reasons"] or []
                if task is None or sample is None:
                    continue
                key = (task, int(sample))
                meta = json.loads(row["metadata_json"]) if row["metadata_json"] else {}
                if runs_again(reasons, meta.get("stats", {}).get("calls", 0)):
                    again.add(key)
                    self.runs_again_from[row["session_id"]] = seq
                else:
                    keys.add(key)
                if evaluators is None:
                    continue
                why = rejudges(reasons, (meta.get("extra") or {}).get("evaluation"), evaluators.get(key, ""))
                candidates.pop(row["session_id"], None)  # a later row of the session says it anew
                if why is not None:
                    candidates[row["session_id"]] = RejudgeCandidate(row["session_id"], task, int(sample), why, seq)
        self.failed_before_model = len(again - keys)
        self.to_rejudge = [c for c in candidates.values() if (c.task_id, c.sample_index) in keys]
        return keys

    def rejudged(self, verdicts: dict[str, RejudgedSession]) -> None:
        """Count the sessions a rerun judged again as their new verdicts say (re-read from their batches)."""
        if not verdicts:
            return
        reader = BatchReader(self.bucket, self.job)
        rejudged = current_rejudgings(self.bucket, self.job)
        for seq in reader.seqs():
            table = reader.read_table(seq)
            if set(table.column("session_id").to_pylist()) & set(verdicts):
                table = read_as_now(table, rejudged, seq)
                self._sessions.update(sealed_sessions(
                    table.select([c for c in ROW_COLUMNS if c in table.column_names]).to_pylist()))

    def _seal(self, traces: list[Any]) -> list[str]:
        try:
            manifest = self.sealer.seal(traces)
        except SealError as exc:
            self.errors.append(str(exc))
            return []
        self.sealed_traces += manifest.traces
        self._sealed_now(manifest.seq, sealed_sessions(
            {"session_id": t.meta.session_id, "outcome_kind": t.meta.outcome_kind.value, "quarantined": t.meta.quarantined,
             "fail_closed_reasons": t.meta.fail_closed_reasons, "diagnostics": t.meta.diagnostics} for t in traces))
        return [f"{self.job_uri}/batches/{manifest.seq:06d}"]

    def _count(self, manifest: Any) -> None:
        """A batch an earlier attempt staged, sealed now: counted from its rows (its traces are not at hand)."""
        self.sealed_traces += manifest.traces
        table = BatchReader(self.bucket, self.job).read_table(manifest)
        self._sealed_now(manifest.seq, sealed_sessions(
            table.select([c for c in ROW_COLUMNS if c in table.column_names]).to_pylist()))

    def _sealed_now(self, seq: int, sessions: dict[str, SealedSession]) -> None:
        """Sessions this run sealed in batch `seq`: counted as these rows say, and those it ran again noted."""
        self._sessions.update(sessions)
        self.resealed.update({sid: seq for sid in sessions if sid in self.runs_again_from})

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
