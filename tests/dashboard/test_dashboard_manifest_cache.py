"""A dashboard started again over a SeaweedFS bucket reads no manifest it read before (tracefleet.dashboard.
manifest_cache): the first start reads each once, the second none, a batch sealed since is read, and a batch
rewritten under the same seq (its job deleted and run again) is read again, not taken from the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.sealed_jobs import synthetic_traces, write_batches
from tracefleet.bucket import S3Bucket, open_bucket
from tracefleet.contract.layout import MANIFEST, PACKS_DIR, job_root
from tracefleet.dashboard.source import Source


def counted_gets(monkeypatch: pytest.MonkeyPatch, ending: str = "") -> list[str]:
    """The keys S3 buckets are asked for from now on (those ending with `ending`), in order."""
    reads: list[str] = []
    get = S3Bucket.get

    def counting(self: S3Bucket, key: str) -> bytes:
        if key.endswith(ending):
            reads.append(key)
        return get(self, key)

    monkeypatch.setattr(S3Bucket, "get", counting)
    return reads


def test_a_restarted_dashboard_reads_only_the_manifests_it_has_not(s3: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEFLEET_CACHE", str(tmp_path / "cache"))
    name = s3.create_bucket()
    creds = {"endpoint_url": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key}
    bucket = open_bucket(f"s3://{name}/team", **creds)
    write_batches(bucket, "alpha", synthetic_traces(0, 40, job="alpha"), 4)
    reads = counted_gets(monkeypatch, MANIFEST)

    def start() -> Source:
        source = Source(f"s3://{name}/team", **creds)
        source.refresh()
        return source

    first = start()
    assert len(first.jobs["alpha"].manifests) == 10 and len(reads) == 10
    reads.clear()
    again = start()  # a new process would do the same: the cache is a file
    assert len(again.jobs["alpha"].manifests) == 10 and reads == []
    assert [m.sessions for _, m in sorted(again.jobs["alpha"].manifests.items())] == [4] * 10
    write_batches(bucket, "alpha", synthetic_traces(40, 4, job="alpha"), 4)  # sealed since
    assert len(start().jobs["alpha"].manifests) == 11 and len(reads) == 1
    reads.clear()
    for obj in list(bucket.list(job_root("alpha"))):  # the job deleted and run again: 8 sessions in 1 batch
        bucket.delete(obj.key)
    write_batches(bucket, "alpha", synthetic_traces(0, 8, job="alpha"), 8)
    rerun = start()
    assert [m.sessions for m in rerun.jobs["alpha"].manifests.values()] == [8] and len(reads) == 1


def test_a_cold_start_reads_a_hundred_manifests_in_one_pack(s3: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """250 batches sealed: the sealer wrote packs of batches 0-99 and 100-199 (tracefleet.contract.batch.ManifestPack);
    a dashboard with nothing kept reads those 2 objects and the 50 manifests after them, and shows every batch as its
    own manifest says."""
    monkeypatch.setenv("TRACEFLEET_CACHE", str(tmp_path / "cache"))
    name = s3.create_bucket()
    creds = {"endpoint_url": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key}
    bucket = open_bucket(f"s3://{name}/team", **creds)
    sealed = write_batches(bucket, "beta", synthetic_traces(0, 250, job="beta"), 1)
    assert sorted(o.key.rsplit("/", 1)[-1] for o in bucket.list(f"{job_root('beta')}/{PACKS_DIR}/")) == [
        "000000.json", "000100.json"]
    reads = counted_gets(monkeypatch)
    source = Source(f"s3://{name}/team", **creds)
    source.refresh()
    manifests = source.jobs["beta"].manifests
    assert sorted(manifests) == list(range(250))
    assert all(manifests[m.seq] == m for m in sealed)
    assert sum(k.endswith(MANIFEST) for k in reads) == 50 and sum(f"/{PACKS_DIR}/" in k for k in reads) == 2
