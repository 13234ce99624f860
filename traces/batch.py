"""Traces ↔ Arrow/Parquet, and the batch manifest.

Parquet columns (one row per trace):

| column | type | |
|---|---|---|
| `tokens` | list<int32> | the token stream |
| `loss_mask` | list<uint8> | 1 = sampled by the policy |
| `logprobs` | list<float32> | engine logprob at sampled positions, **null** at masked positions |
| `spans` | list<struct<call_id, prompt_start, completion_start, completion_end, policy_version, finish_reason, temperature, top_p, top_k, logprobs_mode>> | turn boundaries, the sampling sent and what kind the logprobs are |
| `trace_id`, `job`, `session_id`, `task_id`, `group_id`, `harness`, `model`, `tokenizer`, `builder`, `outcome` | string | |
| `new_root_reason` | string | why the trace's first call started a trace (`auxiliary`: a call beside the agent's conversation; null when it branched) |
| `sample_index`, `num_tokens`, `num_trainable`, `policy_version_min`, `policy_version_max`, `schema_version` | int32 | |
| `reward`, `evaluator_reward` | float64 | reward after the fail-closed rules / as the evaluator gave it |
| `fail_closed_reasons`, `finish_reasons` | list<string> | |
| `outcome_kind` | string | whose outcome the row is: `ok`, `policy` (fail-closed by the policy: counted) or `infrastructure` (left out of training by default, BatchReader; tracefleet.contract.semantics.OutcomeKind) |
| `diagnostics` | list<struct<name, version, severity, message, action, file, line, call_id>> | the session's diagnostic findings (tracefleet.diagnostics) |
| `quarantined` | bool | a diagnostic quarantined the session: reward <= 0, left out of training by default (BatchReader) |
| `metadata_json` | string | the full `TraceMetadata` (timings, reconstruction stats, extra) |
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracefleet.contract.semantics import DROPPED_BY_DIAGNOSTICS, OutcomeKind

from tracefleet.contract.batch import DiagnosticStats, RewardStats

from tracefleet.traces.schema import TRACE_SCHEMA_VERSION, Span, Trace, TraceMetadata

SPAN_TYPE = pa.struct(
    [
        ("call_id", pa.string()),
        ("prompt_start", pa.int32()),
        ("completion_start", pa.int32()),
        ("completion_end", pa.int32()),
        ("policy_version", pa.int32()),
        ("finish_reason", pa.string()),
        ("temperature", pa.float64()),
        ("top_p", pa.float64()),
        ("top_k", pa.int32()),
        ("logprobs_mode", pa.string()),
    ]
)


FINDING_TYPE = pa.struct(
    [
        ("name", pa.string()),
        ("version", pa.string()),
        ("severity", pa.string()),
        ("message", pa.string()),
        ("action", pa.string()),
        ("file", pa.string()),
        ("line", pa.int32()),
        ("call_id", pa.string()),
    ]
)
FINDING_FIELDS = [f.name for f in FINDING_TYPE]


def finding_row(finding: dict[str, Any]) -> dict[str, Any]:
    """A finding (tracefleet.diagnostics.base.Finding as JSON) as one `diagnostics` struct."""
    return {k: finding.get(k) for k in FINDING_FIELDS}


def _list_column(arrays: list[np.ndarray], dtype: np.dtype, arrow_type: pa.DataType, null_nan: bool = False) -> pa.Array:
    lengths = np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("batch too large for one Parquet list column chunk (2^31 tokens); seal fewer traces per batch")
    flat = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)
    values = pa.array(flat, type=arrow_type, mask=np.isnan(flat) if null_nan else None)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def traces_to_table(traces: list[Trace]) -> pa.Table:
    metas = [t.meta for t in traces]

    def col(name: str) -> list[Any]:
        return [getattr(m, name) for m in metas]

    spans = [[s.model_dump() for s in t.spans] for t in traces]
    pvs = [[s.policy_version for s in t.spans] or [0] for t in traces]
    return pa.table(
        {
            "trace_id": pa.array(col("trace_id"), pa.string()),
            "job": pa.array(col("job"), pa.string()),
            "session_id": pa.array(col("session_id"), pa.string()),
            "task_id": pa.array(col("task_id"), pa.string()),
            "group_id": pa.array(col("group_id"), pa.string()),
            "sample_index": pa.array(col("sample_index"), pa.int32()),
            "harness": pa.array(col("harness"), pa.string()),
            "model": pa.array(col("model"), pa.string()),
            "tokenizer": pa.array(col("tokenizer"), pa.string()),
            "builder": pa.array(col("builder"), pa.string()),
            "reward": pa.array(col("reward"), pa.float64()),
            "evaluator_reward": pa.array(col("evaluator_reward"), pa.float64()),
            "outcome": pa.array(col("outcome"), pa.string()),
            "new_root_reason": pa.array(col("new_root_reason"), pa.string()),
            "fail_closed_reasons": pa.array(col("fail_closed_reasons"), pa.list_(pa.string())),
            "outcome_kind": pa.array([m.outcome_kind.value for m in metas], pa.string()),
            "finish_reasons": pa.array(col("finish_reasons"), pa.list_(pa.string())),
            "num_tokens": pa.array([t.num_tokens for t in traces], pa.int32()),
            "num_trainable": pa.array([t.num_trainable for t in traces], pa.int32()),
            "policy_version_min": pa.array([min(p) for p in pvs], pa.int32()),
            "policy_version_max": pa.array([max(p) for p in pvs], pa.int32()),
            "tokens": _list_column([t.tokens for t in traces], np.dtype(np.int32), pa.int32()),
            "loss_mask": _list_column([t.loss_mask for t in traces], np.dtype(np.uint8), pa.uint8()),
            "logprobs": _list_column([t.logprobs for t in traces], np.dtype(np.float32), pa.float32(), null_nan=True),
            "spans": pa.array(spans, pa.list_(SPAN_TYPE)),
            "diagnostics": pa.array([[finding_row(d) for d in m.diagnostics] for m in metas],
                                    pa.list_(FINDING_TYPE)),
            "quarantined": pa.array([m.quarantined for m in metas], pa.bool_()),
            "schema_version": pa.array([TRACE_SCHEMA_VERSION] * len(traces), pa.int32()),
            "metadata_json": pa.array([m.model_dump_json() for m in metas], pa.string()),
        }
    )


def table_to_parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    # Dictionary encoding only pays for the metadata strings; on token ids / logprobs it is wasted work
    # that falls back anyway. zstd level 1: most of the ratio at a fraction of the time.
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(table, sink, compression="zstd", compression_level=1, use_dictionary=strings,
                   row_group_size=max(1, table.num_rows))
    return sink.getvalue()


def parquet_to_table(data: bytes) -> pa.Table:
    # Single-threaded, from an Arrow buffer: after a threaded read, pyarrow 26 here aborted the process at
    # exit under load ("terminate called without an active exception": 15 of 80 short-lived readers, a
    # `tracefleet traces show` among them) and never did without threads (0 of 230). Decoding a 36 MB
    # batch takes 209 ms instead of 183.
    return pq.read_table(pa.BufferReader(data), use_threads=False, pre_buffer=False)


def list_values(column: pa.ChunkedArray | pa.Array, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[n+1], flat values) of a list column; null elements become NaN (floats) or 0."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values
    if np.issubdtype(dtype, np.floating):
        flat = values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    else:
        flat = values.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return offsets, flat


def table_to_traces(table: pa.Table) -> list[Trace]:
    tok_off, tokens = list_values(table.column("tokens"), np.dtype(np.int32))
    mask_off, mask = list_values(table.column("loss_mask"), np.dtype(np.uint8))
    lp_off, logprobs = list_values(table.column("logprobs"), np.dtype(np.float32))
    spans = table.column("spans").to_pylist()
    metas = table.column("metadata_json").to_pylist()
    out: list[Trace] = []
    for i in range(table.num_rows):
        out.append(
            Trace(
                tokens=tokens[tok_off[i] : tok_off[i + 1]],
                loss_mask=mask[mask_off[i] : mask_off[i + 1]],
                logprobs=logprobs[lp_off[i] : lp_off[i + 1]],
                spans=[Span(**s) for s in spans[i]],
                meta=TraceMetadata.model_validate_json(metas[i]),
            )
        )
    return out


def summarize(traces: list[Trace]) -> dict[str, Any]:
    """Manifest fields that describe the traces (counts, tokens, reward stats)."""
    sessions: dict[str, tuple[float | None, str]] = {}
    kinds: dict[str, OutcomeKind] = {}  # a session's rows share its reasons, so its kind
    builders: dict[str, int] = {}
    for t in traces:
        sessions.setdefault(t.meta.session_id, (t.meta.reward, t.meta.outcome))
        kinds.setdefault(t.meta.session_id, t.meta.outcome_kind)
        builders[t.meta.builder] = builders.get(t.meta.builder, 0) + 1
    rewards = np.array([r for r, _ in sessions.values() if r is not None], dtype=np.float64)
    stats = RewardStats(
        count=sum(1 for t in traces if t.meta.reward is not None),
        sessions=len(sessions),
        positive=int((rewards > 0).sum()),
        fail_closed=sum(1 for _, o in sessions.values() if o == "fail_closed"),
    )
    quarantined: set[str] = set()
    dropped_sessions: set[str] = set()
    diagnostics: dict[str, DiagnosticStats] = {}
    judged: set[str] = set()
    for t in traces:
        if t.meta.session_id in judged:
            continue  # a session's findings are on each of its rows: count them once
        judged.add(t.meta.session_id)
        if t.meta.quarantined:
            quarantined.add(t.meta.session_id)
        dropped = DROPPED_BY_DIAGNOSTICS in t.meta.fail_closed_reasons
        if dropped:
            dropped_sessions.add(t.meta.session_id)
        for name in {d["name"] for d in t.meta.diagnostics}:
            entry = diagnostics.setdefault(name, DiagnosticStats())
            entry.sessions += 1
            entry.quarantined += int(t.meta.quarantined)
            entry.dropped += int(dropped)
        for d in t.meta.diagnostics:
            diagnostics[d["name"]].findings += 1
    if rewards.size:
        stats.mean, stats.std = float(rewards.mean()), float(rewards.std())
        stats.min, stats.max = float(rewards.min()), float(rewards.max())
    return {
        "traces": len(traces),
        "sessions": len(sessions),
        "groups": len({t.meta.group_id for t in traces if t.meta.group_id is not None}),
        "tokens": sum(t.num_tokens for t in traces),
        "trainable_tokens": sum(t.num_trainable for t in traces),
        "builders": builders,
        "reward": stats,
        "quarantined_sessions": len(quarantined),
        "dropped_sessions": len(dropped_sessions),
        "diagnostics": diagnostics,
        "outcome_kinds": {k: n for k in OutcomeKind if (n := sum(1 for v in kinds.values() if v == k))},
    }
