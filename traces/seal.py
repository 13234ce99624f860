"""Sealing: traces → one numbered, immutable batch in a bucket, atomically and without duplicates.

Bucket layout (stable; readers rely on it):

    <prefix>/<job>/batches/<seq:06d>/traces-<batch_id>.parquet   data (written first)
    <prefix>/<job>/batches/<seq:06d>/manifest.json               written last, conditional create
    <prefix>/<job>/consumers/<consumer>.json                     a reader's cursor {"next_seq": N}
    <prefix>/<job>/manifest-packs/<first:06d>.json               a hundred manifests in one object (write_pack)

A batch exists iff its `manifest.json` exists; the manifest lists every data object with its size and
sha256, and readers read only what it lists. Protocol:

1. *Stage*: the Parquet file and its would-be manifest go to the local spool
   (`<spool>/<job>/<batch_id>/`), fsync'd. From here on the data survives a dead bucket or a crash.
2. *Dedup*: list the job's batches; if a manifest with this `batch_id` already exists (a retry after an
   unknown outcome, or a rerun sealing the same traces: `batch_id` defaults to the content hash), that
   batch is the result.
3. *Claim*: seq = highest sealed seq + 1; upload the data object (its name carries the batch_id, so two
   sealers racing for the same seq never overwrite each other's data), then create `manifest.json` with
   `If-None-Match: *`. If another sealer created it first, delete our now-orphaned object (best effort;
   an orphan without a manifest is invisible) and try seq + 1.
4. *Done*: remove the spool entry. On any bucket error the spool entry stays and `SealError` says where;
   `Sealer.flush()` (or `tracefleet traces flush`) uploads whatever is pending.

Because seq N+1 is only ever claimed after seq N's manifest exists, sealed seqs are contiguous and a
follower can read them in order.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from tracefleet.bucket import Bucket, BucketError, ObjectNotFound, spool_dir

from tracefleet.contract.layout import (MANIFEST, MANIFEST_PACK_SIZE, batch_dir, batch_key_parts, batches_prefix,
                                        data_object_name, job_root, manifest_key, manifest_pack_key)
from tracefleet.contract.batch import BatchManifest, ManifestPack, ObjectEntry

from tracefleet.traces.batch import summarize, table_to_parquet, table_to_traces, traces_to_table
from tracefleet.traces.schema import Trace

class SealError(RuntimeError):
    """The batch could not be uploaded; its data is kept at `spooled` and can be flushed later."""

    def __init__(self, message: str, spooled: Path) -> None:
        super().__init__(f"{message} (batch kept on local disk at {spooled}; retry with Sealer.flush())")
        self.spooled = spooled


def sealed_seqs(bucket: Bucket, job: str) -> tuple[list[int], dict[int, set[str]]]:
    """(seqs that have a manifest, sorted; every seq → its object names) from one listing."""
    names: dict[int, set[str]] = {}
    for obj in bucket.list(batches_prefix(job)):
        parts = batch_key_parts(job, obj.key)
        if parts is not None:
            names.setdefault(parts[0], set()).add(parts[1])
    return sorted(s for s, n in names.items() if MANIFEST in n), names


class Sealer:
    def __init__(self, bucket: Bucket, job: str, *, spool: str | os.PathLike[str] | None = None, max_claims: int = 10_000) -> None:
        self.bucket = bucket
        self.job = job_root(job)
        self.spool = spool_dir(spool) / self.job
        self.max_claims = max_claims

    # 1. stage -----------------------------------------------------------------------------------
    def stage(self, traces: Sequence[Trace] | pa.Table, batch_id: str | None = None) -> Path:
        table = traces if isinstance(traces, pa.Table) else traces_to_table(list(traces))
        data = table_to_parquet(table)
        digest = hashlib.sha256(data).hexdigest()
        batch_id = batch_id or digest[:32]
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", batch_id):
            raise ValueError(f"invalid batch_id {batch_id!r}")
        summary = summarize(traces if not isinstance(traces, pa.Table) else table_to_traces(table))
        manifest = BatchManifest(
            job=self.job,
            batch_id=batch_id,
            sealer=f"{socket.gethostname()}:{os.getpid()}",
            objects=[ObjectEntry(name=data_object_name(batch_id), size=len(data), sha256=digest, rows=table.num_rows)],
            **summary,
        )
        final = self.spool / batch_id
        if (final / MANIFEST).exists():
            return final  # already staged (a rerun with the same content)
        tmp = self.spool / f".staging-{batch_id}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir(parents=True)
        _write_durable(tmp / manifest.objects[0].name, data)
        _write_durable(tmp / MANIFEST, manifest.model_dump_json(indent=2).encode())
        try:
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent stage of identical content won
        return final

    def pending(self) -> list[Path]:
        if not self.spool.is_dir():
            return []
        return sorted(p for p in self.spool.iterdir() if p.is_dir() and (p / MANIFEST).exists())

    # 2-4. upload ----------------------------------------------------------------------------------
    def upload(self, staged: Path) -> BatchManifest:
        try:
            result = self._upload(staged)
        except BucketError as exc:
            raise SealError(f"sealing into {self.bucket.uri} failed: {exc}", staged) from exc
        shutil.rmtree(staged, ignore_errors=True)
        return result

    def _upload(self, staged: Path) -> BatchManifest:
        manifest = BatchManifest.model_validate_json((staged / MANIFEST).read_bytes())
        obj = manifest.objects[0]
        seqs, names = sealed_seqs(self.bucket, self.job)
        for seq in seqs:  # dedup: our data object next to a manifest that names our batch
            if obj.name in names.get(seq, ()):
                existing = self._read_manifest(seq)
                if existing is not None and existing.batch_id == manifest.batch_id:
                    return existing
        seq = (seqs[-1] + 1) if seqs else 0
        for _ in range(self.max_claims):
            key = f"{batch_dir(self.job, seq)}/{obj.name}"
            self.bucket.put_file(key, staged / obj.name)
            claimed = manifest.model_copy(update={"seq": seq, "created_at": time.time()})
            if self.bucket.create_exclusive(manifest_key(self.job, seq), claimed.model_dump_json(indent=2).encode()):
                write_pack(self.bucket, self.job, claimed)
                return claimed
            existing = self._read_manifest(seq)
            if existing is not None and existing.batch_id == manifest.batch_id:
                return existing  # our own earlier attempt (its response was lost) or an identical twin
            try:
                self.bucket.delete(key)
            except BucketError:
                pass  # an orphan without a manifest is invisible to readers
            seq += 1
        raise BucketError(f"could not claim a batch number after {self.max_claims} attempts")

    def _read_manifest(self, seq: int) -> BatchManifest | None:
        try:
            return BatchManifest.model_validate_json(self.bucket.get(manifest_key(self.job, seq)))
        except ObjectNotFound:
            return None

    def seal(self, traces: Sequence[Trace] | pa.Table, batch_id: str | None = None) -> BatchManifest:
        """Stage then upload; raises SealError (data kept in the spool) when the bucket fails."""
        return self.upload(self.stage(traces, batch_id))

    def flush(self) -> list[BatchManifest]:
        """Upload every staged batch (oldest first). Stops at the first failure, raising SealError."""
        pending = sorted(self.pending(), key=lambda p: (p / MANIFEST).stat().st_mtime)
        return [self.upload(p) for p in pending]


def write_pack(bucket: Bucket, job: str, sealed: BatchManifest) -> bool:
    """After `sealed` (just claimed), the manifest pack it completes (tracefleet.contract.batch.ManifestPack), when
    it is the last of one: the earlier manifests read back (seqs are contiguous: they exist). Best effort, whether
    written: a reader without the pack reads the manifests one by one."""
    first = sealed.seq + 1 - MANIFEST_PACK_SIZE
    if first < 0 or first % MANIFEST_PACK_SIZE:
        return False
    try:
        manifests = [BatchManifest.model_validate_json(bucket.get(manifest_key(job, seq))) for seq in range(first, sealed.seq)]
        pack = ManifestPack(job=job, first=first, manifests=[*manifests, sealed])
        return bucket.create_exclusive(manifest_pack_key(job, first), pack.model_dump_json().encode())
    except (BucketError, ValueError):
        return False


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def seal_traces(bucket: Bucket, job: str, traces: Sequence[Trace], *, spool: str | os.PathLike[str] | None = None,
                batch_id: str | None = None) -> BatchManifest:
    """One-call sealing for the runner: `seal_traces(open_bucket(uri), job, result.traces)`."""
    return Sealer(bucket, job, spool=spool).seal(traces, batch_id)

