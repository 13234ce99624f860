"""The trainer reader: list / follow a job's sealed batches, as Arrow tables or padded torch tensors.

    from tracefleet.traces import BatchReader
    reader = BatchReader("s3://bucket/prefix", job="my-job", consumer="trainer-0")
    for batch in reader.follow(poll_s=5):                       # each sealed batch exactly once, in order
        t = batch.tensors(pad_token_id=0)  # input_ids, attention_mask, loss_mask, old_logprobs, advantages, trained
        train_step(t)
        reader.commit(batch)                                   # cursor in the bucket: restart-safe

One row identity: `Batch.table`, `Batch.traces()`, `Batch.advantages()` and every tensor of `Batch.tensors()`
cover the batch's sealed rows, all of them, in the same order, so they zip. A row the trainer must not train on
is still there: its advantage is 0, its `loss_mask` all 0 and `trained` False (`tensors()`'s [B] bool). Those
are auxiliary traces (a harness's title or summary calls: sealed, labelled, not trained on by default;
`include_auxiliary=True` keeps them), quarantined ones (a diagnostic judged how the session earned its reward
invalid: `quarantined` column, reward already <= 0; `include_quarantined=True`) and rows the infrastructure
failed (`outcome_kind` `infrastructure`: an evaluator that could not run or report, a stage of ours that failed;
`include_infrastructure=True`): their reward <= 0 says nothing about the policy, so they are also left out of the
GRPO statistics (tracefleet.contract.semantics). `training_table()` is the subset whose `trained` is True: a
table, each row with its `session_id`; join on it, never zip it with the others. `take_rows(t, t["trained"])`
keeps a trainer's forward passes to the trained rows.

`tensors()` refuses raw logprobs as `old_logprobs` (a span whose `logprobs_mode` is `raw_logprobs`: vLLM's
default, taken before temperature and top-k/top-p, so not the behaviour policy's) with `RawLogprobs`, unless
`allow_raw_logprobs=True` (a trainer that corrects for it, or sampled at T=1 without truncation).

Overlays (tracefleet.traces.overlay): verdicts `tracefleet diagnose --write-overlay` wrote for sessions
already sealed. `read` (and `follow`) apply the job's overlays by default: a session an overlay
quarantines is marked `quarantined` in the batch it reads and left out exactly like one quarantined at
sealing, its findings are in the `diagnostics` column (`Batch.findings()`), `Batch.overlays` lists what was
applied. Re-judgings (tracefleet.traces.rejudge) apply first: a session a rerun judged again (its evaluator
could not judge it when it was sealed) has its newest verdict on its rows, in the batch that sealed it, never a
second row; a session a rerun ran again is read from its newest batch only. `BatchReader(..., overlays=False)` reads
the sealed data alone.

Only manifests make batches visible; every object is checked against the manifest's size and sha256.
The cursor (`<job>/consumers/<consumer>.json`, {"next_seq": N}) moves only on `commit`, so a trainer that
dies mid-batch sees that batch again after a restart, and never sees a committed batch twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracefleet.contract.semantics import AUXILIARY, OutcomeKind
from tracefleet.bucket import Bucket, BucketError, ObjectNotFound, open_bucket
from tracefleet.contract.engine_limits import RAW_LOGPROBS
from tracefleet.contract.layout import batch_object_key, cursor_key, job_root, manifest_key

from tracefleet.traces.advantages import group_advantages
from tracefleet.contract.batch import BatchManifest

from tracefleet.traces.batch import list_values, parquet_to_table, table_to_traces
from tracefleet.traces.overlay import Overlay, apply_overlays, current_overlays
from tracefleet.traces.rejudge import Rejudged, Rejudging, current_rejudgings, read_as_now, rejudged_manifest
from tracefleet.traces.schema import Trace
from tracefleet.traces.seal import sealed_seqs
from tracefleet.traces.versions import NOT_SAMPLED, Stale, stale_bound, token_versions


class CorruptBatch(BucketError):
    pass


class RawLogprobs(ValueError):
    """Rows whose logprobs are raw (taken before temperature/top-k/top-p) asked for as behaviour logprobs."""


def check_behaviour_logprobs(table: pa.Table) -> None:
    """Raise RawLogprobs when any span of `table` records raw logprobs (batches sealed before spans recorded
    their logprobs_mode pass)."""
    # plain Arrow array methods, not pyarrow.compute: its thread pool, once started, aborted a process that exits
    # with torch loaded ("terminate called without an active exception"), as a refused trainer does
    spans = table.column("spans").combine_chunks().flatten()
    if "logprobs_mode" not in {f.name for f in spans.type}:
        return
    modes = spans.field("logprobs_mode").to_pylist()
    raw = modes.count(RAW_LOGPROBS)
    if raw:
        raise RawLogprobs(
            f"{raw} of {len(modes)} spans hold raw logprobs (taken before temperature/top-k/top-p), not the behaviour "
            "policy's: serve processed logprobs (vLLM: --logprobs-mode processed_logprobs; the CPU engine reports "
            "them), or pass allow_raw_logprobs=True if the trainer corrects for it")


@dataclass
class Batch:
    manifest: BatchManifest  # its counts as its rows read (re-judgings applied)
    table: pa.Table  # the sealed rows, with the re-judgings and overlays applied
    overlays: list[Overlay] = field(default_factory=list)  # the job's overlays when read (each diagnostic's newest)
    _traces: list[Trace] | None = field(default=None, repr=False)

    @property
    def seq(self) -> int:
        return self.manifest.seq

    def traces(self) -> list[Trace]:
        if self._traces is None:
            self._traces = table_to_traces(self.table)
            if self.overlays and {"diagnostics", "quarantined"} <= set(self.table.column_names):
                # the metadata JSON is the sealed one: carry the overlays' columns over
                columns = self.table.select(["diagnostics", "quarantined", "reward"]).to_pylist()
                for t, row in zip(self._traces, columns, strict=True):
                    t.meta.diagnostics, t.meta.quarantined, t.meta.reward = row["diagnostics"], row["quarantined"], row["reward"]
        return self._traces

    def findings(self) -> dict[str, list[dict[str, Any]]]:
        """Every session's findings (sealed and from overlays), by session id; sessions without any
        are left out."""
        if "diagnostics" not in self.table.column_names:
            return {}
        out: dict[str, list[dict[str, Any]]] = {}
        for sid, found in zip(self.table.column("session_id").to_pylist(), self.table.column("diagnostics").to_pylist(),
                              strict=True):
            if found and sid not in out:
                out[sid] = found
        return out

    def trained(self, *, include_auxiliary: bool = False, include_quarantined: bool = False,
                include_infrastructure: bool = False) -> list[bool]:
        """One flag per row of `table`: whether a trainer trains on it (module docstring)."""
        return trained_mask(self.table, include_auxiliary=include_auxiliary, include_quarantined=include_quarantined,
                            include_infrastructure=include_infrastructure)

    def training_table(self, *, include_auxiliary: bool = False, include_quarantined: bool = False,
                       include_infrastructure: bool = False) -> pa.Table:
        """The rows of `table` a trainer trains on (`trained()`): a subset, each row with its `session_id`."""
        return training_rows(self.table, include_auxiliary=include_auxiliary, include_quarantined=include_quarantined,
                             include_infrastructure=include_infrastructure)

    def advantages(self, *, leave_one_out: bool = False, normalize_std: bool = True,
                   include_auxiliary: bool = False, include_quarantined: bool = False,
                   include_infrastructure: bool = False) -> np.ndarray:
        """One advantage per row of `table`: the GRPO group advantage over the trained rows, 0 on the others."""
        trained = self.trained(include_auxiliary=include_auxiliary, include_quarantined=include_quarantined,
                               include_infrastructure=include_infrastructure)
        return row_advantages(self.table, trained, leave_one_out=leave_one_out, normalize_std=normalize_std)

    def tensors(self, *, include_auxiliary: bool = False, include_quarantined: bool = False,
                include_infrastructure: bool = False, **kwargs: Any) -> dict[str, Any]:
        """Padded tensors of every row of `table`, the untrained ones masked (see padded_tensors)."""
        trained = self.trained(include_auxiliary=include_auxiliary, include_quarantined=include_quarantined,
                               include_infrastructure=include_infrastructure)
        return padded_tensors(self.table, trained=trained, **kwargs)


def trained_mask(table: pa.Table, *, include_auxiliary: bool = False, include_quarantined: bool = False,
                 include_infrastructure: bool = False) -> list[bool]:
    """Per row of `table`: False on auxiliary rows (unless `include_auxiliary`), quarantined rows (unless
    `include_quarantined`) and rows the infrastructure failed (unless `include_infrastructure`); batches sealed
    before those columns existed have none."""
    keep = [True] * table.num_rows
    if not include_auxiliary and "new_root_reason" in table.column_names:
        keep = [k and r != AUXILIARY for k, r in zip(keep, table.column("new_root_reason").to_pylist())]
    if not include_quarantined and "quarantined" in table.column_names:
        keep = [k and not q for k, q in zip(keep, table.column("quarantined").to_pylist())]
    if not include_infrastructure and "outcome_kind" in table.column_names:
        keep = [k and o != OutcomeKind.INFRASTRUCTURE for k, o in zip(keep, table.column("outcome_kind").to_pylist())]
    return keep


def training_rows(table: pa.Table, **include: bool) -> pa.Table:
    """The rows of `table` that `trained_mask` keeps."""
    keep = trained_mask(table, **include)
    if all(keep):
        return table
    return table.take(pa.array([i for i, k in enumerate(keep) if k], pa.int64()))


def row_advantages(table: pa.Table, trained: list[bool], *, leave_one_out: bool = False,
                   normalize_std: bool = True) -> np.ndarray:
    """One advantage per row of `table`: the group statistics over the `trained` rows only, 0 on the others."""
    rows = [i for i, k in enumerate(trained) if k]
    out = np.zeros(table.num_rows, dtype=np.float32)
    if rows:
        kept = table.take(pa.array(rows, pa.int64())).select(["reward", "group_id", "session_id"])
        out[rows] = group_advantages(kept.column("reward").to_pylist(), kept.column("group_id").to_pylist(),
                                     kept.column("session_id").to_pylist(), leave_one_out=leave_one_out,
                                     normalize_std=normalize_std)
    return out


def take_rows(t: dict[str, Any], rows: Any) -> dict[str, Any]:
    """`t` (padded_tensors) with only `rows` (indices or a [B] bool mask), cut to the longest of them: every
    tensor the same rows, so they still line up with each other (not with `Batch.table`)."""
    import torch

    rows = torch.as_tensor(rows)
    index = rows.nonzero().flatten() if rows.dtype == torch.bool else rows
    width = int(t["attention_mask"][index].sum(dim=1).max()) if index.numel() else 0
    return {k: (v[index][:, :width] if v.dim() == 2 else v[index]) for k, v in t.items()}


def padded_tensors(
    table: pa.Table,
    *,
    trained: list[bool] | None = None,
    pad_token_id: int = 0,
    max_length: int | None = None,
    leave_one_out: bool = False,
    normalize_std: bool = True,
    advantages: np.ndarray | None = None,
    device: Any = None,
    min_policy_version: int | None = None,
    max_lag: int | None = None,
    stale: Stale = "mask",
    temperature: float = 1.0,
    allow_raw_logprobs: bool = False,
) -> dict[str, Any]:
    """Right-padded [B, T] tensors, one row per row of `table` in its order: input_ids (long), attention_mask
    (long), loss_mask (float), old_logprobs (float, 0 where loss_mask is 0), advantages (float, the trace's
    advantage on its trainable positions), token_versions (long: the policy version that sampled each token, -1
    where none did), temperatures (float: the temperature each token was sampled at as its span records it;
    `temperature` where the call left it to the engine, 1 on context), plus rewards [B], sequence_advantages [B]
    and trained [B] (bool). A row not `trained` (default: every row is) has loss_mask 0 and advantage 0 and is
    left out of the group statistics. Traces longer than `max_length` are cut at the end (only trailing tokens
    are lost; what remains is still causal). RawLogprobs when a row's logprobs are raw, unless
    `allow_raw_logprobs`. `advantages` given: one per row, used as they are (0 on the rows not trained).

    Staleness (tracefleet.traces.versions): tokens sampled by a version below `min_policy_version`, or more
    than `max_lag` versions behind the newest in the table, are masked out of the loss (`stale="mask"`), or
    their rows not trained (`stale="drop"`: `trained` False, left out of the group statistics)."""
    if not allow_raw_logprobs:
        check_behaviour_logprobs(table)
    import torch

    trained = [True] * table.num_rows if trained is None else list(trained)
    spans = table.column("spans").to_pylist() if "spans" in table.column_names else [[]] * table.num_rows
    row_lengths = pc.list_value_length(table.column("tokens")).to_pylist()
    versions = [token_versions(sp, n) for sp, n in zip(spans, row_lengths, strict=True)]
    flat = np.concatenate(versions) if versions else np.zeros(0, np.int32)
    bound = stale_bound(flat, min_policy_version, max_lag)
    if bound is not None and stale == "drop":
        trained = [k and not ((v != NOT_SAMPLED) & (v < bound)).any() for k, v in zip(trained, versions, strict=True)]
    tok_off, tokens = list_values(table.column("tokens"), np.dtype(np.int64))
    _, mask = list_values(table.column("loss_mask"), np.dtype(np.float32))
    _, logprobs = list_values(table.column("logprobs"), np.dtype(np.float32))
    lengths = np.diff(tok_off)
    b = len(lengths)
    t = int(lengths.max()) if b else 0
    if max_length is not None:
        t = min(t, max_length)
    keep = np.asarray(trained, dtype=bool)
    if advantages is None:
        advantages = row_advantages(table, trained, leave_one_out=leave_one_out, normalize_std=normalize_std)
    advantages = np.where(keep, np.asarray(advantages, dtype=np.float32), np.float32(0.0))
    ids = np.full((b, t), pad_token_id, dtype=np.int64)
    attn = np.zeros((b, t), dtype=np.int64)
    lm = np.zeros((b, t), dtype=np.float32)
    olp = np.zeros((b, t), dtype=np.float32)
    ver = np.full((b, t), NOT_SAMPLED, dtype=np.int64)
    temps = np.ones((b, t), dtype=np.float32)
    for i in range(b):  # one slice copy per trace, no per-token Python
        s, n = int(tok_off[i]), int(min(lengths[i], t))
        ids[i, :n] = tokens[s : s + n]
        attn[i, :n] = 1
        lm[i, :n] = mask[s : s + n]
        olp[i, :n] = logprobs[s : s + n]
        ver[i, :n] = versions[i][:n]
        for span in spans[i]:
            temps[i, span["completion_start"] : min(span["completion_end"], n)] = span.get("temperature") or temperature
    if bound is not None:
        lm[(ver != NOT_SAMPLED) & (ver < bound)] = 0.0
    lm[~keep] = 0.0
    olp = np.where(lm > 0, np.nan_to_num(olp, nan=0.0), 0.0).astype(np.float32)
    adv_tok = lm * np.asarray(advantages, dtype=np.float32)[:, None]
    rewards = np.array([0.0 if v is None else v for v in table.column("reward").to_pylist()], dtype=np.float32)
    out = {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(attn),
        "loss_mask": torch.from_numpy(lm),
        "old_logprobs": torch.from_numpy(olp),
        "advantages": torch.from_numpy(adv_tok),
        "token_versions": torch.from_numpy(ver),
        "temperatures": torch.from_numpy(temps),
        "rewards": torch.from_numpy(rewards),
        "sequence_advantages": torch.from_numpy(advantages),
        "trained": torch.from_numpy(keep),
    }
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    return out


class BatchReader:
    def __init__(self, bucket: Bucket | str | os.PathLike[str], job: str, *, consumer: str | None = None,
                 verify: bool = True, overlays: bool = True, **bucket_options: Any) -> None:
        self.bucket = bucket if hasattr(bucket, "create_exclusive") else open_bucket(bucket, **bucket_options)  # type: ignore[arg-type]
        self.job = job_root(job)
        if consumer is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", consumer):
            raise ValueError(f"invalid consumer name {consumer!r}")
        self.consumer = consumer
        self.verify = verify
        self.apply_overlays = overlays
        self._overlays: dict[str, Overlay] = {}  # by key: overlay objects are never rewritten
        self._rejudgings: dict[str, Rejudging] = {}  # by key: the same
        self._position: int | None = None

    # listing --------------------------------------------------------------------------------------
    def seqs(self) -> list[int]:
        return sealed_seqs(self.bucket, self.job)[0]

    def manifest(self, seq: int) -> BatchManifest:
        return BatchManifest.model_validate_json(self.bucket.get(manifest_key(self.job, seq)))

    def batches(self) -> list[BatchManifest]:
        """Every sealed batch's manifest, its counts as its rows read now (re-judgings: `read`)."""
        manifests = [self.manifest(s) for s in self.seqs()]
        if not self.apply_overlays:
            return manifests
        batches = self.rejudgings().batches
        return [rejudged_manifest(m, batches) for m in manifests]

    # reading --------------------------------------------------------------------------------------
    def read_table(self, batch: int | BatchManifest) -> pa.Table:
        manifest = self.manifest(batch) if isinstance(batch, int) else batch
        tables = []
        for obj in manifest.objects:
            data = self.bucket.get(batch_object_key(self.job, manifest.seq, obj.name))
            if self.verify and (len(data) != obj.size or hashlib.sha256(data).hexdigest() != obj.sha256):
                raise CorruptBatch(f"batch {manifest.seq} object {obj.name}: size/sha256 differ from the manifest")
            tables.append(parquet_to_table(data))
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def read(self, batch: int | BatchManifest) -> Batch:
        manifest = self.manifest(batch) if isinstance(batch, int) else batch
        table = self.read_table(manifest)
        if not self.apply_overlays:
            return Batch(manifest=manifest, table=table)
        overlays = self.overlays()
        rejudged = self.rejudgings()
        table = read_as_now(table, rejudged, manifest.seq)  # the verdict first, a diagnostic's overlay on top
        return Batch(manifest=rejudged_manifest(manifest, rejudged.batches), table=apply_overlays(table, overlays),
                     overlays=overlays)

    def overlays(self) -> list[Overlay]:
        """The job's overlays as they are now (each diagnostic's newest): one listing."""
        return current_overlays(self.bucket, self.job, self._overlays)

    def rejudgings(self) -> Rejudged:
        """The job's re-judged sessions' newest verdicts and their batches' counts now: one listing."""
        return current_rejudgings(self.bucket, self.job, self._rejudgings)

    # consuming ------------------------------------------------------------------------------------
    def _cursor_key(self) -> str:
        if self.consumer is None:
            raise ValueError("a cursor needs a consumer name: BatchReader(..., consumer='trainer-0')")
        return cursor_key(self.job, self.consumer)

    def cursor(self) -> int:
        """The next seq this consumer has not committed (0 for a new consumer)."""
        try:
            return int(json.loads(self.bucket.get(self._cursor_key()))["next_seq"])
        except ObjectNotFound:
            return 0

    def commit(self, batch: Batch | BatchManifest | int) -> None:
        seq = batch if isinstance(batch, int) else batch.seq if isinstance(batch, Batch) else batch.seq
        body = {"consumer": self.consumer, "job": self.job, "next_seq": seq + 1, "updated_at": time.time()}
        self.bucket.put(self._cursor_key(), json.dumps(body).encode())

    def follow(self, *, poll_s: float = 5.0, timeout_s: float | None = None, idle_exit: bool = False,
               start: int | None = None) -> Iterator[Batch]:
        """Yield batches from the consumer's cursor on, in seq order, waiting for new ones. Stops after
        `timeout_s` without a new batch, or at the first empty poll when `idle_exit`."""
        position = start if start is not None else (self.cursor() if self.consumer else 0)
        idle_since = time.monotonic()
        while True:
            ready = [s for s in self.seqs() if s >= position]
            for seq in ready:
                batch = self.read(seq)
                position = seq + 1
                yield batch
            if ready:
                idle_since = time.monotonic()
                continue
            if idle_exit or (timeout_s is not None and time.monotonic() - idle_since >= timeout_s):
                return
            time.sleep(poll_s)
