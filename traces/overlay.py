"""Overlays: a diagnostic's verdicts on sessions already sealed, applied by the reader (issue 14).

Sealed batches are never rewritten. `tracefleet diagnose URI --job J --diagnostic D --write-overlay`
writes one object per diagnostic, `<job>/overlays/<diagnostic>/<stamp>.json` (layout.overlay_key): the
diagnostic's name, version and action, the batches it judged, and each flagged session's findings.
`BatchReader` applies the job's overlays whenever it reads a batch (`BatchReader(..., overlays=False)`
reads the sealed data alone):

- A session an overlay quarantines (or drops) is treated exactly like one quarantined at sealing: its
  rows get `quarantined = True` and reward `min(reward, 0)` (`evaluator_reward` keeps the evaluator's),
  so `training_table()`, `tensors()` and `advantages()` leave them out, and out of the group statistics,
  unless `include_quarantined=True`. A `drop` overlay cannot unseal rows: it quarantines them too.
- Its findings are appended to the rows' `diagnostics` column (`Batch.findings()` gives them by session)
  and `Batch.overlays` lists the overlays that were applied. An overlay only adds: it never lifts a
  quarantine sealed in, nor removes a sealed finding.
- Several diagnostics: every one's newest overlay applies; a session is quarantined if any quarantines it.
- The same diagnostic written again: its newest overlay (by stamp: the writing time) replaces the older
  ones whatever their versions, so what was run last is what trainers read; older objects stay as
  history. An overlay that flags nothing withdraws the diagnostic's verdicts.
- A trainer that already read a batch keeps what it read: overlays apply when a batch is read (`read`,
  `follow`), a committed batch is not delivered again; `reader.read(seq)` reads it anew with them.
- An overlay names sessions, not rows: it covers the sessions of the batches it judged (`seqs`); batches
  sealed later are judged by the job's own `spec.diagnostics`, not by an overlay.

Reading cost: one listing of `<job>/overlays/` per batch read; overlay objects are immutable (a new
stamp per write), so a reader fetches each one once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, Field

from tracefleet.bucket import Bucket
from tracefleet.contract.layout import overlay_key, overlay_key_parts, overlays_prefix

from tracefleet.contract.diagnostics import QUARANTINING, Action, quarantined_reward

from tracefleet.traces.batch import FINDING_TYPE, finding_row

OVERLAY_VERSION = 1


class Overlay(BaseModel):
    overlay_version: int = OVERLAY_VERSION
    job: str
    diagnostic: str
    version: str  # the diagnostic's
    action: Action
    created_at: float = Field(default_factory=time.time)
    seqs: list[int] = Field(default_factory=list)  # the batches judged
    judged: int = 0  # sessions judged (those with evidence)
    sessions: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)  # flagged session id -> findings

    @property
    def quarantines(self) -> bool:
        return self.action in QUARANTINING


def overlay_stamp() -> str:
    """Sorts by writing time (ns); the random tail keeps two writers in one nanosecond apart."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def write_overlay(bucket: Bucket, overlay: Overlay) -> str:
    """Write `overlay` as a new object (never over another); its key."""
    key = overlay_key(overlay.job, overlay.diagnostic, overlay_stamp())
    if not bucket.create_exclusive(key, overlay.model_dump_json().encode()):
        raise FileExistsError(f"overlay {key} already exists")
    return key


def current_overlays(bucket: Bucket, job: str, cache: dict[str, Overlay] | None = None) -> list[Overlay]:
    """Each diagnostic's newest overlay, by diagnostic name, from one listing; `cache` (key -> Overlay)
    saves fetching an object again."""
    newest: dict[str, tuple[str, str]] = {}
    for obj in bucket.list(overlays_prefix(job)):
        parts = overlay_key_parts(job, obj.key)
        if parts is not None and (parts[0] not in newest or parts[1] > newest[parts[0]][0]):
            newest[parts[0]] = (parts[1], obj.key)
    cache = {} if cache is None else cache
    out = []
    for diagnostic in sorted(newest):
        key = newest[diagnostic][1]
        if key not in cache:
            cache[key] = Overlay.model_validate_json(bucket.get(key))
        out.append(cache[key])
    return out


def apply_overlays(table: pa.Table, overlays: Iterable[Overlay]) -> pa.Table:
    """`table` with the overlays' findings added to `diagnostics` and their quarantines applied
    (`quarantined`, reward <= 0); the table itself when no overlay names one of its sessions."""
    active = [o for o in overlays if o.sessions]
    if not active or table.num_rows == 0:
        return table
    sids = table.column("session_id").to_pylist()
    rows = [i for i, s in enumerate(sids) if any(s in o.sessions for o in active)]
    if not rows:
        return table
    n = table.num_rows
    names = table.column_names
    diagnostics = table.column("diagnostics").to_pylist() if "diagnostics" in names else [[] for _ in range(n)]
    quarantined = table.column("quarantined").to_pylist() if "quarantined" in names else [False] * n
    rewards = table.column("reward").to_pylist()
    for i in rows:
        diagnostics[i] = list(diagnostics[i] or [])
        for o in active:
            for finding in o.sessions.get(sids[i], ()):
                row = finding_row(finding)
                if row not in diagnostics[i]:
                    diagnostics[i].append(row)
            if sids[i] in o.sessions and o.quarantines:
                quarantined[i] = True
                rewards[i] = quarantined_reward(rewards[i])
    for name, values, type_ in (("diagnostics", diagnostics, pa.list_(FINDING_TYPE)),
                                ("quarantined", quarantined, pa.bool_()),
                                ("reward", rewards, table.schema.field("reward").type)):
        column = pa.array(values, type_)
        table = table.set_column(names.index(name), name, column) if name in names else table.append_column(name, column)
    return table
