"""A dashboard started again over a SeaweedFS bucket reads no manifest it read before (tracefleet.dashboard.
manifest_cache): the first start reads each once, the second none, a batch sealed since is read, and a batch
rewritten under the same seq (its job deleted and run again) is read again, not taken from the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.sealed_jobs import synthetic_traces, write_batches
from tracefleet.bucket import S3Bucket, open_bucket
from tracefleet.contract.layout import MANIFEST, job_root
from tracefleet.dashboard.source import Source


def test_a_restarted_dashboard_reads_only_the_manifests_it_has_not(s3: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEFLEET_CACHE", str(tmp_path / "cache"))
    name = s3.create_bucket()
    creds = {"endpoint_url": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key}
    bucket = open_bucket(f"s3://{name}/team", **creds)
    write_batches(bucket, "alpha", synthetic_traces(0, 40, job="alpha"), 4)
    reads: list[str] = []
    get = S3Bucket.get

    def counting(self: S3Bucket, key: str) -> bytes:
        if key.endswith(MANIFEST):
            reads.append(key)
        return get(self, key)

    monkeypatch.setattr(S3Bucket, "get", counting)

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
