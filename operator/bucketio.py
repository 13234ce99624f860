"""The operator's bucket reads: tasks JSONL and sealed batch manifests.

The pods write the bucket (the operator never does), where tracefleet.contract.layout says: the proxy sidecar
each session's capture and artifacts, the evaluator Job its reward, the sealer Job the batches.

A sealer Job seals with `batch_id = k8s-<job seq>` (tracefleet.contract.layout.batch_id_for); the bucket seq is whatever the Sealer claims, so
the operator finds a Job's batch by its batch_id (a manifest's presence is what "sealed" means).
"""

from __future__ import annotations

from typing import Any

from tracefleet.contract.semantics import diagnostics_counts, outcome_counts
from tracefleet.bucket import ObjectNotFound, open_bucket
from tracefleet.contract.sealed_batch import SealedBatch
from tracefleet.contract.layout import batch_uri, capture_key, manifest_key, session_prefix
from tracefleet.contract.batch import BatchManifest
from tracefleet.traces.seal import sealed_seqs


def bucket_options(creds: dict[str, str] | None, endpoint: str | None = None) -> dict[str, Any]:
    creds = creds or {}
    opts: dict[str, Any] = {}
    if endpoint or creds.get("AWS_ENDPOINT_URL"):
        opts["endpoint_url"] = endpoint or creds["AWS_ENDPOINT_URL"]
    if creds.get("AWS_ACCESS_KEY_ID"):
        opts["access_key"] = creds["AWS_ACCESS_KEY_ID"]
        opts["secret_key"] = creds.get("AWS_SECRET_ACCESS_KEY")
    if creds.get("AWS_REGION") or creds.get("AWS_DEFAULT_REGION"):
        opts["region"] = creds.get("AWS_REGION") or creds.get("AWS_DEFAULT_REGION")
    return opts


def session_made_calls(uri: str, job: str, session: int, creds: dict[str, str] | None = None,
                       endpoint: str | None = None) -> bool:
    """Whether the session's uploaded capture log holds a model call (a missing or empty log: none)."""
    key = capture_key(job, session)
    bucket = open_bucket(uri, **bucket_options(creds, endpoint))
    return any(obj.key == key and obj.size > 0 for obj in bucket.list(session_prefix(job, session)))


def read_text(uri: str, creds: dict[str, str] | None = None, endpoint: str | None = None) -> str | None:
    """Text of one object given by its full URI (tasks JSONL), or None when missing."""
    base, _, key = uri.rstrip("/").rpartition("/")
    try:
        return open_bucket(base, **bucket_options(creds, endpoint)).get(key).decode()
    except ObjectNotFound:
        return None


def find_batch(
    uri: str, job: str, batch_id: str, skip_seqs: set[int], creds: dict[str, str] | None = None, endpoint: str | None = None
) -> SealedBatch | None:
    """The sealed batch with `batch_id`, or None; its `diagnostics` are what the job's diagnostics made of
    its sessions (semantics.DiagnosticsCounts), its `outcomes` its sessions by outcome kind (semantics.OutcomeCounts).

    One listing of the job's batches, then manifest reads only for seqs not yet attributed."""
    bucket = open_bucket(uri, **bucket_options(creds, endpoint))
    seqs, _ = sealed_seqs(bucket, job)
    for seq in reversed(seqs):
        if seq in skip_seqs:
            continue
        m = BatchManifest.model_validate_json(bucket.get(manifest_key(job, seq)))
        if m.batch_id == batch_id:
            return SealedBatch(seq=seq, batch_id=batch_id, uri=batch_uri(uri, job, seq), traces=m.traces, tokens=m.tokens,
                               mean_reward=m.reward.mean, sessions=m.sessions,
                               diagnostics=diagnostics_counts(m).to_json(), outcomes=outcome_counts(m).to_json())
    return None
