"""Re-judgings: a rerun's new verdicts on sealed sessions the judge could not judge, applied by the reader.

What is judged again, and why, is tracefleet.contract.rejudge's; this module writes a rerun's verdicts as one object
(`<job>/rejudged/<stamp>.json`) and gives a session's rows their newest verdict when a batch is read. No row is
sealed twice and no sealed batch rewritten: the session's rows stay in the batch that sealed them, with its group,
and their verdict columns are what the newest re-judging says:

- `fail_closed_reasons`: the judging's reasons (`evaluator_<status>`) replaced by the new verdict's, the session's
  others (its capture, its tool calls, a row without tokens) kept; `outcome` and `outcome_kind` follow from them
  (tracefleet.contract.semantics.outcome_kind), so a session judged now is `ok` or the policy's, and trained on;
- `reward` the new reward under the fail-closed rules, `evaluator_reward` the evaluator's;
- `diagnostics` and `quarantined` the job's diagnostics over the evidence with the new verdict (they replace the
  sealed findings, which judged a session without a verdict);
- `metadata_json` the same, its `extra.evaluation` the new judging and `extra.rejudged` why and when;
- the batch's manifest counts (`rejudged_manifest`): recounted from its rows by the rerun, kept in the re-judging.
Diagnostic overlays (tracefleet.traces.overlay) apply after, on top. Several reruns: each session's newest wins.

A session a rerun ran again (it failed before its first model call, so its sealed row holds no token) is sealed
again in a new batch; the re-judging names it in `superseded`, and its earlier row is no longer read: each session
is read once, as its newest rows say.

Reading cost: one listing of `<job>/rejudged/` per batch read; the objects are immutable, fetched once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracefleet.bucket import Bucket
from tracefleet.contract.diagnostics import quarantined_reward
from tracefleet.contract.layout import rejudged_key, rejudged_prefix
from tracefleet.contract.rejudge import RejudgedSession, Rejudging, judging_reason
from tracefleet.contract.semantics import outcome_kind
from tracefleet.contract.batch import BatchManifest
from tracefleet.traces.batch import FINDING_TYPE, finding_row, summarize, table_to_traces
from tracefleet.traces.overlay import overlay_stamp

__all__ = ["Rejudged", "RejudgedSession", "Rejudging", "apply_rejudgings", "batch_counts", "current_rejudgings",
           "read_as_now", "rejudged_manifest", "without_superseded", "write_rejudging"]

# the manifest's fields that count its rows (what a verdict can change), not those naming the batch
COUNT_FIELDS = {"traces", "sessions", "groups", "tokens", "trainable_tokens", "builders", "reward", "quarantined_sessions",
                "dropped_sessions", "diagnostics", "outcome_kinds"}


def write_rejudging(bucket: Bucket, rejudging: Rejudging) -> str:
    """Write `rejudging` as a new object (never over another); its key."""
    key = rejudged_key(rejudging.job, overlay_stamp())
    if not bucket.create_exclusive(key, rejudging.model_dump_json().encode()):
        raise FileExistsError(f"re-judging {key} already exists")
    return key


@dataclass
class Rejudged:
    """A job's re-judgings as they stand: each session's newest verdict, each batch's newest counts."""

    sessions: dict[str, RejudgedSession] = field(default_factory=dict)  # by session id
    batches: dict[int, dict[str, Any]] = field(default_factory=dict)  # by seq: its manifest's counts now
    superseded: dict[str, int] = field(default_factory=dict)  # session id -> the batch holding its rows now


def current_rejudgings(bucket: Bucket, job: str, cache: dict[str, Rejudging] | None = None) -> Rejudged:
    """The job's re-judgings, the newest winning, from one listing; `cache` (key -> Rejudging) saves fetching an
    object again."""
    cache = {} if cache is None else cache
    out = Rejudged()
    for obj in sorted(bucket.list(rejudged_prefix(job)), key=lambda o: o.key):  # stamps sort by writing time
        if not obj.key.endswith(".json"):
            continue
        if obj.key not in cache:
            cache[obj.key] = Rejudging.model_validate_json(bucket.get(obj.key))
        out.sessions.update(cache[obj.key].sessions)
        out.batches.update(cache[obj.key].batches)
        out.superseded.update(cache[obj.key].superseded)
    return out


def without_superseded(table: pa.Table, superseded: dict[str, int], seq: int) -> pa.Table:
    """Batch `seq`'s rows but those of sessions whose rows a later batch holds (a rerun ran them again); the table
    itself when it has none."""
    if not superseded or table.num_rows == 0:
        return table
    keep = [superseded.get(s, seq) == seq for s in table.column("session_id").to_pylist()]
    return table if all(keep) else table.filter(pa.array(keep, pa.bool_()))


def read_as_now(table: pa.Table, rejudged: Rejudged, seq: int) -> pa.Table:
    """Batch `seq`'s sealed rows as a reader reads them now: superseded rows left out, verdicts applied."""
    return apply_rejudgings(without_superseded(table, rejudged.superseded, seq), rejudged.sessions)


def rejudged_manifest(manifest: BatchManifest, batches: dict[int, dict[str, Any]]) -> BatchManifest:
    """`manifest` with its counts as its rows read now (a re-judging's `batches`); itself when none of its sessions
    was judged again. Its identity (seq, batch id, objects) is the sealed one."""
    counts = batches.get(manifest.seq)
    if counts is None:
        return manifest
    return BatchManifest.model_validate({**manifest.model_dump(), **counts})


def batch_counts(table: pa.Table) -> dict[str, Any]:
    """A batch's manifest counts from its rows (with verdicts applied): what a re-judging records for it."""
    return BatchManifest.model_validate({"job": "", "batch_id": "", **summarize(table_to_traces(table))}).model_dump(
        mode="json", include=COUNT_FIELDS)


def rejudged_reasons(sealed: list[str], verdict: RejudgedSession) -> list[str]:
    """A row's fail-closed reasons with its judging's replaced by the verdict's, in the judging's place."""
    out: list[str] = []
    placed = False
    for reason in sealed:
        if not judging_reason(reason):
            out.append(reason)
        elif not placed:
            out += verdict.reasons
            placed = True
    return out if placed else verdict.reasons + out


def apply_rejudgings(table: pa.Table, verdicts: dict[str, RejudgedSession]) -> pa.Table:
    """`table` with each re-judged session's rows given its verdict (module doc), in the verdict columns it has (the
    dashboard reads the scalar ones); the table itself when none of its sessions was judged again."""
    if not verdicts or table.num_rows == 0:
        return table
    sids = table.column("session_id").to_pylist()
    rows = [i for i, s in enumerate(sids) if s in verdicts]
    if not rows:
        return table
    names = table.column_names
    columns: dict[str, list[Any]] = {name: table.column(name).to_pylist() for name in (
        "reward", "evaluator_reward", "outcome", "fail_closed_reasons", "outcome_kind", "diagnostics", "quarantined",
        "metadata_json") if name in names}
    for i in rows:
        verdict = verdicts[sids[i]]
        meta = json.loads(columns["metadata_json"][i]) if "metadata_json" in columns else {}
        reasons = rejudged_reasons(list(columns["fail_closed_reasons"][i] or []), verdict)
        answered = (meta.get("stats") or {}).get("answered_calls", 1) > 0
        reward = verdict.reward if not reasons else min(verdict.reward, 0.0) if verdict.reward is not None else 0.0
        if verdict.quarantined:
            reward = quarantined_reward(reward)
        row = {"reward": reward, "evaluator_reward": verdict.reward, "outcome": "fail_closed" if reasons else "ok",
               "fail_closed_reasons": reasons, "outcome_kind": outcome_kind(reasons, model_answered=answered).value,
               "diagnostics": [finding_row(f) for f in verdict.findings], "quarantined": verdict.quarantined}
        for name, value in row.items():
            if name in columns:
                columns[name][i] = value
        if "metadata_json" not in columns:
            continue
        extra = meta.setdefault("extra", {})
        extra["rejudged"] = {"why": verdict.why, "before": extra.get("evaluation")}
        extra.update(evaluation=verdict.evaluation.model_dump(mode="json"), session_status=verdict.status,
                     session_stage=verdict.stage, session_error=verdict.error)
        meta.update({k: v for k, v in row.items() if k != "diagnostics"}, diagnostics=verdict.findings)
        columns["metadata_json"][i] = json.dumps(meta)
    for name, values in columns.items():
        field = table.schema.field(name)
        type_ = pa.list_(FINDING_TYPE) if name == "diagnostics" else field.type
        table = table.set_column(names.index(name), field.name, pa.array(values, type_))
    return table
