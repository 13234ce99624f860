"""tracefleet.traces: capture logs → trainer-ready traces → sealed Parquet batches → the trainer reader.

    from tracefleet.traces import build_traces, Sealer, BatchReader, SessionInfo
    result = build_traces("capture/sess.jsonl", session=SessionInfo(job="j", group_id="task-1", reward=1.0))
    Sealer(open_bucket("s3://bucket/prefix"), "j").seal(result.traces)
    for batch in BatchReader("s3://bucket/prefix", job="j", consumer="trainer").follow(): ...

The schema and the bucket layout: docs/reference/bucket.md.
"""

from tracefleet.traces.advantages import group_advantages
from tracefleet.contract.batch import BatchManifest

from tracefleet.traces.batch import table_to_traces, traces_to_table
from tracefleet.traces.build import BUILDERS, build_from_calls, build_traces
from tracefleet.traces.calls import Call, calls_from_records
from tracefleet.traces.reader import Batch, BatchReader, RawLogprobs, padded_tensors
from tracefleet.traces.schema import TRACE_SCHEMA_VERSION, BuildResult, ReconstructionStats, SessionInfo, Span, Trace, TraceMetadata
from tracefleet.traces.seal import SealError, Sealer, seal_traces

__all__ = [
    "BUILDERS",
    "TRACE_SCHEMA_VERSION",
    "Batch",
    "BatchManifest",
    "BatchReader",
    "BuildResult",
    "Call",
    "RawLogprobs",
    "ReconstructionStats",
    "SealError",
    "Sealer",
    "SessionInfo",
    "Span",
    "Trace",
    "TraceMetadata",
    "build_from_calls",
    "build_traces",
    "calls_from_records",
    "group_advantages",
    "padded_tensors",
    "seal_traces",
    "table_to_traces",
    "traces_to_table",
]
